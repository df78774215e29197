"""End to end: the orchestrator rolls a ClusterVersion out over OCM managed clusters.

The ClusterVersion lives on the main control plane; the orchestrator (a real process) calls the
OCM plugin, which talks to the hub apiserver where the emulator plays the OCM agents.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from orchestrator import api
from tests.plugins.ocm.conftest import NEW, OLD, StartPlugin, curator_config, work_config
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import MC, PLACEMENT, OcmEmulator, select_clusters
from tests.support.orchestrator import CV, OrchestratorProcess
from tests.support.plugin_harness import orchestrator_process

__all__ = ["orchestrator_process"]  # the fixture `orchestrator`

TAINT_KEY = "fleetupgrade.io/service-out"


def cluster_version(endpoint: str, ids: list[str], required: int) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "ocm-fleet"},
        "spec": {
            "requiredAvailableCount": required,
            "opsEndpoint": {"endpoint": endpoint, "insecure": True},
            "clusters": [{"id": c, "version": NEW} for c in ids],
        },
    }


@pytest.fixture
def placement(hub: KubeCluster) -> Iterator[Callable[[str], tuple[str, str]]]:
    """placement(group): a Placement selecting the clusters labelled group=<group>."""
    client = hub.api_client()
    custom = k8s.CustomObjectsApi(client)
    namespace = f"apps-{uuid.uuid4().hex[:6]}"
    k8s.CoreV1Api(client).create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))
    )

    def create(group: str) -> tuple[str, str]:
        body = {
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "Placement",
            "metadata": {"name": "storefront", "namespace": namespace},
            "spec": {
                "predicates": [
                    {
                        "requiredClusterSelector": {
                            "labelSelector": {"matchLabels": {"group": group}}
                        }
                    }
                ]
            },
        }
        custom.create_namespaced_custom_object(
            PLACEMENT[0], PLACEMENT[1], namespace, PLACEMENT[2], body
        )
        return namespace, "storefront"

    yield create
    custom.delete_collection_namespaced_custom_object(
        PLACEMENT[0], PLACEMENT[1], namespace, PLACEMENT[2]
    )
    hub.delete_namespace(namespace)
    client.close()


class PlacementObserver:
    """Samples, in a thread, which clusters carry our taint and which the Placement selects.

    Each sample reads one list of ManagedClusters and decides from it, so both halves of a
    sample describe the same moment (the placement controller also decides from one view).
    """

    def __init__(self, hub: KubeCluster, namespace: str, name: str, ids: list[str]) -> None:
        self.samples: list[tuple[frozenset[str], frozenset[str]]] = []
        self._stop = threading.Event()
        self._api = hub.api_client()
        self._custom = k8s.CustomObjectsApi(self._api)
        self._placement = self._custom.get_namespaced_custom_object(
            PLACEMENT[0], PLACEMENT[1], namespace, PLACEMENT[2], name
        )
        self._ids = frozenset(ids)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            clusters = [
                mc
                for mc in self._custom.list_cluster_custom_object(*MC)["items"]
                if mc["metadata"]["name"] in self._ids
            ]
            tainted = frozenset(
                mc["metadata"]["name"]
                for mc in clusters
                if any(t["key"] == TAINT_KEY for t in (mc.get("spec") or {}).get("taints") or [])
            )
            selected = frozenset(select_clusters(self._placement, clusters))
            self.samples.append((tainted, selected))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._api.close()


def test_a_rollout_over_four_managed_clusters_converges_and_placements_follow_service(
    control_plane: KubeCluster,
    hub: KubeCluster,
    namespace: str,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    placement: Callable[[str], tuple[str, str]],
    orchestrator: OrchestratorProcess,
) -> None:
    ids = names(4)
    emulator.upgrade_seconds = 1.0
    for name in ids:
        emulator.add_cluster(name, OLD, labels={"group": ids[0]})
    placement_ns, placement_name = placement(ids[0])
    plugin = start_plugin(curator_config())
    assert emulator.placement_decisions(placement_ns, placement_name) == ids
    observer = PlacementObserver(hub, placement_ns, placement_name, ids)
    cvs = CV(control_plane, namespace)
    cvs.create(cluster_version(plugin.address, ids, 3))
    try:
        status = wait_for(
            "the rollout completes",
            lambda: cvs.phase_is("ocm-fleet", "Completed"),
            timeout=120,
            interval=0.2,
        )
    finally:
        observer.stop()
    assert status["summary"]["upToDate"] == 4
    assert [emulator.version_of(c) for c in ids] == [NEW] * 4
    assert emulator.curations_started == dict.fromkeys(ids, 1)
    assert all(emulator.taints_of(c) == [] for c in ids)
    # While a cluster was out of service the Placement did not select it; afterwards it did.
    out_seen: set[str] = set()
    for tainted, selected in observer.samples:
        assert not tainted & selected, (
            f"Placement selected {sorted(tainted & selected)} out of service"
        )
        assert len(tainted) <= 1, "the floor of 3 available allows one cluster out at a time"
        out_seen |= tainted
    assert out_seen, "no sample caught a cluster out of service"
    assert emulator.placement_decisions(placement_ns, placement_name) == ids
    for cluster in plugin.client.list_clusters():
        if cluster.id in ids:
            assert cluster.in_service and cluster.control_plane_version == NEW


def test_a_failed_curation_halts_the_rollout_with_the_curators_message(
    control_plane: KubeCluster,
    namespace: str,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    orchestrator: OrchestratorProcess,
) -> None:
    ids = names(4)
    for name in ids:
        emulator.add_cluster(name, OLD)
    emulator.fail_next_curation(ids[0], "Timed out waiting for monitor upgrade job")
    plugin = start_plugin(curator_config())
    cvs = CV(control_plane, namespace)
    cvs.create(cluster_version(plugin.address, ids, 3))
    status = wait_for(
        "the rollout halts", lambda: cvs.phase_is("ocm-fleet", "Halted"), timeout=60, interval=0.2
    )
    # Per-cluster state lives on the run's ClusterUpgrades (issue 11's objects).
    failed = cvs.failed("ocm-fleet")
    assert list(failed) == [ids[0]]
    assert "Timed out waiting for monitor upgrade job" in failed[ids[0]]["message"]
    assert "CURATION_FAILED" in failed[ids[0]]["message"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Halted"
    assert ids[0] in ready["message"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ClusterFailed"
    time.sleep(1.5)  # give a misbehaving controller the chance to touch another cluster
    assert emulator.curations_started == {ids[0]: 1}
    assert [emulator.version_of(c) for c in ids] == [OLD] * 4
    assert [t["key"] for t in emulator.taints_of(ids[0])] == [TAINT_KEY]  # stays out of service
    assert all(emulator.taints_of(c) == [] for c in ids[1:])


def test_a_rollout_by_manifest_work_converges(
    control_plane: KubeCluster,
    namespace: str,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    orchestrator: OrchestratorProcess,
) -> None:
    ids = names(3)
    for name in ids:
        emulator.add_cluster(name, OLD)
    plugin = start_plugin(work_config())
    cvs = CV(control_plane, namespace)
    cvs.create(cluster_version(plugin.address, ids, 2))
    status = wait_for(
        "the rollout completes",
        lambda: cvs.phase_is("ocm-fleet", "Completed"),
        timeout=90,
        interval=0.2,
    )
    assert status["summary"]["upToDate"] == 3
    assert [emulator.version_of(c) for c in ids] == [NEW] * 3
    assert all(emulator.taints_of(c) == [] for c in ids)
