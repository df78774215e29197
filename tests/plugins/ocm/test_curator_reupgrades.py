"""Re-upgrades through one ClusterCurator, as the real curator controller acts on writes.

The emulator plays stolostron/cluster-curator-controller @ 2a35aed: its update predicate drops
an update whose status changed (and any update while `operation` stays set or while
intermediateUpdate is set), and NeedToUpgrade decides from the last clustercurator-job
condition. The hub serves the upstream ClusterCurator CRD (CEL stripped for the 1.20 server; the
CEL rules on spec.upgrade are asserted here on every curator the plugin wrote).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm.objects import ANNOTATION_REQUEST_ID
from plugins.sdk.client import PluginCallError
from tests.plugins.ocm.conftest import NEW, OLD, StartPlugin, curator_config, failed_curation
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import CURATOR, OcmEmulator
from tests.support.upstream import cel_rules

SUCCEEDED, FAILED = cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED
THIRD, FOURTH = "1.30.0", "1.31.0"
CURATOR_CRD = "ocm_clustercurators.yaml"


class Curators:
    """Reads and writes ClusterCurators on the hub as a person (or ACM) would."""

    def __init__(self, hub: KubeCluster) -> None:
        self._api = hub.api_client()
        self.custom = k8s.CustomObjectsApi(self._api)

    def get(self, cluster: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(
                CURATOR[0], CURATOR[1], cluster, CURATOR[2], cluster
            )
        )

    def create(self, cluster: str, body: dict[str, Any]) -> None:
        meta = {"name": cluster, "namespace": cluster}
        full = {
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "ClusterCurator",
            "metadata": meta,
            **body,
        }
        self.custom.create_namespaced_custom_object(
            CURATOR[0], CURATOR[1], cluster, CURATOR[2], full
        )

    def patch(self, cluster: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            CURATOR[0], CURATOR[1], cluster, CURATOR[2], cluster, body
        )

    def close(self) -> None:
        self._api.close()


@pytest.fixture
def curators(hub: KubeCluster) -> Any:
    handle = Curators(hub)
    yield handle
    handle.close()


def assert_cel_rules_hold(old: dict[str, Any] | None, new: dict[str, Any]) -> None:
    """The CEL rules of the upstream CRD on spec.upgrade (x-kubernetes-validations), which the
    1.20 test server cannot run, checked for one update old → new."""
    rules = {r.message for r in cel_rules(CURATOR_CRD) if r.path == "spec.upgrade"}
    assert rules == {
        "The intermediateUpdate cannot be modified",
        "The desiredUpdate cannot be modified when intermediateUpdate exists",
        "The intermediateUpdate cannot be created if desiredUpdate is missing or empty",
        "The intermediateUpdate cannot be added via update if desiredUpdate already exists",
    }, "the upstream CEL rules changed: re-check them here"
    after = (new.get("spec") or {}).get("upgrade") or {}
    if "intermediateUpdate" in after:
        assert after.get("desiredUpdate"), "intermediateUpdate needs a desiredUpdate"
    if old is None:
        return
    before = (old.get("spec") or {}).get("upgrade") or {}
    if "intermediateUpdate" in before:
        assert after.get("intermediateUpdate") == before["intermediateUpdate"]
        if before["intermediateUpdate"] and "desiredUpdate" in before:
            assert after.get("desiredUpdate") == before["desiredUpdate"]
    elif before.get("desiredUpdate"):
        assert "intermediateUpdate" not in after


def test_a_second_and_a_third_upgrade_of_the_same_cluster_each_start_a_curation(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    curators: Curators,
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(curator_config(clusterCurator={"channel": "stable"}))
    before: dict[str, Any] | None = None
    for count, target in enumerate((NEW, THIRD, FOURTH), start=1):
        op = plugin.client.upgrade_control_plane(f"up-{target}", name, target)
        final = plugin.end(op.id)
        assert final.state == SUCCEEDED, final.error_message
        assert plugin.client.get_cluster(name).control_plane_version == target
        assert emulator.curations_started == {name: count}
        after = curators.get(name)
        assert_cel_rules_hold(before, after)
        assert after["spec"]["upgrade"]["desiredUpdate"] == target
        assert after["spec"]["desiredCuration"] == "upgrade"  # kept by the job at its end
        job = after["status"]["conditions"][0]
        assert f"Version ({target};stable;" in job["message"]
        before = after
    assert not emulator.errors


def test_a_retry_to_the_same_version_after_a_failure_starts_a_new_curation(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    curators: Curators,
) -> None:
    [name] = names(1)
    plugin, failed = failed_curation(emulator, start_plugin, name, "try-1")
    assert failed.error_code == "CURATION_FAILED"
    [job] = [
        c for c in curators.get(name)["status"]["conditions"] if c["type"] == "clustercurator-job"
    ]
    assert job["reason"] == "Job_failed" and f"Version ({NEW};" in job["message"]
    retry = plugin.end(plugin.client.upgrade_control_plane("try-2", name, NEW).id)
    assert retry.state == SUCCEEDED, retry.error_message
    assert emulator.curations_started == {name: 2}


def test_a_curation_the_controller_launches_between_the_reset_and_the_ask_is_followed(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    curators: Curators,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The failed job's end clears spec.curatorJob, a write the controller's predicate passes,
    so a reconcile is queued. When it runs between the retry's two writes (the status reset,
    then the ask), it finds no failed record and launches the curation to the same version
    itself; the ask then conflicts. The plugin follows that curation as the retry's instead
    of refusing the retry as busy (seen as a CI flake of the test above)."""
    [name] = names(1)
    plugin, _ = failed_curation(emulator, start_plugin, name, "try-1")
    emulator.wait_idle()
    [fleet] = plugin.plugin.fleet.fleets.values()
    hub = fleet._hub
    write = hub.merge_patch
    raced: list[str] = []

    def reconcile_after_the_reset(res: Any, namespace: str, obj: str, body: Any) -> Any:
        written = write(res, namespace, obj, body)
        if "status" in body and not raced:
            emulator.reconcile_curator_now(name)
            raced.append(curators.get(name)["spec"].get("curatorJob", ""))
        return written

    monkeypatch.setattr(hub, "merge_patch", reconcile_after_the_reset)
    retry = plugin.end(plugin.client.upgrade_control_plane("try-2", name, NEW).id)
    assert raced and raced[0], "the controller did not launch a job on the reset state"
    assert retry.state == SUCCEEDED, retry.error_message
    assert emulator.curations_started == {name: 2}
    notes = curators.get(name)["metadata"]["annotations"]
    assert notes[ANNOTATION_REQUEST_ID] == "try-2"


def test_a_curator_acm_created_and_upgraded_before_is_upgraded_and_keeps_its_fields(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    curators: Curators,
) -> None:
    done, failed = names(2)
    for cluster in (done, failed):
        emulator.add_cluster(cluster, OLD)
    acm_spec = {
        "desiredCuration": "upgrade",
        "install": {"towerAuthSecret": "toweraccess", "prehook": [{"name": "provision"}]},
        "upgrade": {
            "desiredUpdate": OLD,
            "channel": "stable",
            "monitorTimeout": 120,
            "towerAuthSecret": "toweraccess",
            "prehook": [{"name": "drain", "extra_vars": {"site": "eu"}}],
            "posthook": [{"name": "smoke-test", "type": "Workflow"}],
        },
    }
    # As ACM leaves them: one after a finished upgrade to OLD, one after a failed one to NEW
    # (the controller never retries that by itself: NeedToUpgrade sees the same version).
    curators.create(done, {"spec": acm_spec})
    curators.patch(
        done,
        {
            "status": {
                "conditions": [
                    {
                        "type": "clustercurator-job",
                        "status": "True",
                        "reason": "Job_has_finished",
                        "message": f"curator-job-acm01 DesiredCuration: upgrade Version "
                        f"({OLD};stable;;;)",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        },
    )
    failed_spec = {**acm_spec, "upgrade": {**acm_spec["upgrade"], "desiredUpdate": NEW}}
    curators.create(failed, {"spec": failed_spec})
    curators.patch(
        failed,
        {
            "status": {
                "conditions": [
                    {
                        "type": "monitor-upgrade",
                        "status": "True",
                        "reason": "Job_failed",
                        "message": "Timed out waiting for monitor upgrade job",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    },
                    {
                        "type": "clustercurator-job",
                        "status": "True",
                        "reason": "Job_failed",
                        "message": f"curator-job-acm02 DesiredCuration: upgrade Version "
                        f"({NEW};stable;;;) Failed - Timed out waiting for monitor upgrade job",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    },
                ]
            }
        },
    )
    originals = {c: curators.get(c) for c in (done, failed)}
    plugin = start_plugin(curator_config(clusterCurator={"channel": "stable"}))
    for cluster in (done, failed):
        final = plugin.end(plugin.client.upgrade_control_plane(f"up-{cluster}", cluster, NEW).id)
        assert final.state == SUCCEEDED, (cluster, final.error_message)
        after = curators.get(cluster)
        assert_cel_rules_hold(originals[cluster], after)
        assert after["spec"]["install"] == originals[cluster]["spec"]["install"]
        upgrade = after["spec"]["upgrade"]
        kept = {
            k: v for k, v in originals[cluster]["spec"]["upgrade"].items() if k != "desiredUpdate"
        }
        assert {k: upgrade[k] for k in kept} == {**kept, "monitorTimeout": 1}
        assert upgrade["desiredUpdate"] == NEW
    assert emulator.curations_started == {done: 1, failed: 1}


def test_the_old_single_write_with_a_status_reset_starts_nothing(
    emulator: OcmEmulator, names: Callable[[int], list[str]], curators: Curators
) -> None:
    """The emulator's predicate: the write the plugin used to make is dropped (the bug)."""
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    finished = {
        "type": "clustercurator-job",
        "status": "True",
        "reason": "Job_has_finished",
        "message": f"curator-job-old DesiredCuration: upgrade Version ({OLD};;;;)",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    curators.create(
        name,
        {"spec": {"desiredCuration": "upgrade", "upgrade": {"desiredUpdate": OLD}}},
    )
    curators.patch(name, {"status": {"conditions": [finished]}})
    emulator.wait_idle()  # the create's reconcile is done (it reads the latest object)
    assert emulator.curations_started.get(name, 0) == 0
    key = f"{name}/{name}"
    dropped = emulator.curator_events_dropped.get(key, 0)
    curators.patch(name, {"spec": {"upgrade": {"desiredUpdate": NEW}}, "status": None})
    wait_for(
        "the controller sees the update and drops it",
        lambda: emulator.curator_events_dropped.get(key, 0) > dropped,
        timeout=10,
    )
    emulator.wait_idle()
    assert emulator.curations_started.get(name, 0) == 0
    assert "curatorJob" not in curators.get(name)["spec"]


def test_an_eus_curator_with_an_intermediate_update_is_refused_and_left_alone(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    curators: Curators,
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    # An EUS curator between curations (no desiredCuration: the controller leaves it alone).
    spec = {"upgrade": {"desiredUpdate": THIRD, "intermediateUpdate": NEW}}
    curators.create(name, {"spec": spec})
    emulator.wait_idle()
    before = curators.get(name)
    plugin = start_plugin(curator_config())
    preflight = plugin.client.preflight_upgrade(name, FOURTH)
    assert preflight.verdict == cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER
    assert preflight.reason_code == "INTERMEDIATE_UPDATE"
    with pytest.raises(PluginCallError) as err:
        plugin.client.upgrade_control_plane("up-eus", name, FOURTH)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "intermediateUpdate" in err.value.message
    assert curators.get(name)["spec"] == before["spec"]
