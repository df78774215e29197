"""Issue 11, failure 7: conditional status writes, a deposed leader that issues nothing more,
and a Lease released on SIGTERM so the next replica takes over at once."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from orchestrator import api
from orchestrator.adapters.kube import Conflict, KubeClient
from tests.e2e.conftest import (
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import OrchestratorProcess

LEASE = "fleet-orchestrator"


def upgrade_body(name: str) -> dict[str, object]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.CLUSTER_UPGRADE_KIND,
        "metadata": {"name": name, "labels": {api.LABEL_RUN: "some-run"}},
        "spec": {
            "clusterId": "cluster-00",
            "stage": "default",
            "stageIndex": 0,
            "version": "1.29.1",
            "nodeVersion": "1.29.1",
            "provider": "127.0.0.1:1",
        },
    }


def test_stale_status_write_gets_409_and_a_reread_write_succeeds(
    control_plane: KubeCluster, namespace: str
) -> None:
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        obj = kube.create_object(api.CLUSTER_UPGRADE_PLURAL, namespace, upgrade_body("cu"))
        stale = obj["metadata"]["resourceVersion"]
        mine = kube.write_status(
            api.CLUSTER_UPGRADE_PLURAL, namespace, "cu", {"phase": "ServicingOut"}, stale
        )
        # Another writer (a deposed replica) still holding the old resourceVersion loses.
        with pytest.raises(Conflict):
            kube.write_status(
                api.CLUSTER_UPGRADE_PLURAL, namespace, "cu", {"phase": "Failed"}, stale
            )
        now = kube.get_object(api.CLUSTER_UPGRADE_PLURAL, namespace, "cu")
        assert now["status"] == {"phase": "ServicingOut"}
        assert now["metadata"]["resourceVersion"] == mine["metadata"]["resourceVersion"]
        # Retried from a re-read, the write goes through.
        again = kube.write_status(
            api.CLUSTER_UPGRADE_PLURAL,
            namespace,
            "cu",
            {"phase": "UpgradingControlPlane"},
            now["metadata"]["resourceVersion"],
        )
        assert again["status"] == {"phase": "UpgradingControlPlane"}
    finally:
        kube.close()


def test_rollout_converges_while_another_writer_keeps_its_objects_changing(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    """Every ClusterUpgrade write of the orchestrator races a writer that changes the object
    under it: stale writes get 409 and are retried from a re-read, never lost or doubled."""
    # Twelve clusters (60 steps, each a status write or two) and a writer that bumps them
    # without pausing, so that, on a busy machine too (a CI run at 8 clusters and a 20 ms
    # pause saw no 409 at all: the race this test is about did not happen),
    # some of the orchestrator's writes land between another writer's bump and its own read.
    fleet = sim(fleet_file(12, step=0.3))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(12), 4, strategy={"maxConcurrency": 4})
    )
    run = objects.current_run("fleet")
    stop = threading.Event()
    bumps = [0]

    def other_writer() -> None:
        while not stop.is_set():
            for up in objects.upgrades(run).values():
                objects.api.patch_namespaced_custom_object(
                    api.GROUP,
                    api.VERSION,
                    objects.ns,
                    api.CLUSTER_UPGRADE_PLURAL,
                    up["metadata"]["name"],
                    {"metadata": {"annotations": {"example.com/touched": str(bumps[0])}}},
                )
                bumps[0] += 1
            stop.wait(0.001)

    conflicts_before = status_conflicts(objects)
    writer = threading.Thread(target=other_writer, daemon=True)
    writer.start()
    try:
        wait_for(
            "the rollout completes",
            lambda: objects.cv_phase_is("fleet", "Completed"),
            timeout=90,
            interval=0.2,
        )
    finally:
        stop.set()
        writer.join(timeout=10)
    assert bumps[0] > 20
    # The apiserver refused stale status writes (409), and the rollout still converged.
    assert status_conflicts(objects) > conflicts_before
    ups = objects.upgrades(run)
    assert all(u["status"]["phase"] == "Upgraded" for u in ups.values()), ups
    assert all(u["metadata"]["annotations"]["example.com/touched"] for u in ups.values())
    m = fleet.monitor()
    assert m["clusters_at_target"] == 12 and m["mutations_total"] == 12 * 5, m
    assert m["duplicate_mutations"] == 0 and m["min_available_in_service"] >= 4, m
    assert not reconcile_errors(orchestrators.logs())


def status_conflicts(objects: Objects) -> int:
    """409 answers the apiserver gave to ClusterUpgrade status writes so far (its /metrics)."""
    request = objects.client.param_serialize(
        "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
    )
    text = objects.client.call_api(*request).read().decode()
    total = 0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'code="409"' in line
            and 'resource="clusterupgrades"' in line
            and 'subresource="status"' in line
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def lease_holder(kube: KubeClient, namespace: str) -> str | None:
    record = kube.get_lease(namespace, LEASE)
    return record.holder if record is not None else None


def standby(proc: OrchestratorProcess) -> bool:
    """The replica is up and waiting for the Lease (its /readyz answers 200)."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{proc.metrics_port}/readyz", timeout=2
        ) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_deposed_leader_issues_nothing_more(
    control_plane: KubeCluster,
    namespace: str,
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
) -> None:
    fleet = sim(fleet_file(12, step=0.5))
    election = ("--enable-leader-election", "--leader-election-namespace", namespace)
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        first = orchestrators.start(*election, identity="replica-a")
        wait_for("replica-a leads", lambda: lease_holder(kube, namespace) == "replica-a")
        orchestrators.start(*election, identity="replica-b")
        objects.create_cv(
            cluster_version("fleet", fleet.address, ids(12), 10, strategy={"maxConcurrency": 2})
        )
        wait_for(
            "replica-a upgrades clusters",
            lambda: sum(1 for c, _ in fleet.calls if c == "replica-a") >= 6,
            timeout=60,
        )
        # The Lease is taken from replica-a (another replica acquired it after a partition).
        record = kube.get_lease(namespace, LEASE)
        assert record is not None
        now = datetime.now(UTC).replace(microsecond=5)
        kube.write_lease(
            namespace,
            LEASE,
            "intruder",
            5,
            record.transitions + 1,
            now,
            now,
            record.resource_version,
        )
        deposed_at = time.monotonic()
        assert first.proc is not None
        assert first.proc.wait(timeout=30) == 1  # it knows it lost, and exits
        wait_for(
            "the rollout completes under replica-b",
            lambda: objects.cv_phase_is("fleet", "Completed"),
            timeout=120,
            interval=0.2,
        )
    finally:
        kube.close()
    a_calls = [t for c, t in fleet.calls if c == "replica-a"]
    b_calls = [t for c, t in fleet.calls if c == "replica-b"]
    # replica-a notices at its next renewal (every 2 s) and issues nothing after that (the
    # renew deadline alone would let it go on for 10 s).
    late = [round(t - deposed_at, 2) for t in a_calls if t > deposed_at + 4.0]
    assert not late, f"replica-a mutated {late} s after it lost the Lease"
    assert b_calls and max(a_calls) < min(b_calls)  # never both at once
    m = fleet.monitor()
    assert m["clusters_at_target"] == 12 and m["duplicate_mutations"] == 0, m
    assert m["min_available_in_service"] >= 10, m
    assert not reconcile_errors(orchestrators.logs())


def test_sigterm_releases_the_lease_and_the_next_replica_takes_over_at_once(
    control_plane: KubeCluster,
    namespace: str,
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
) -> None:
    fleet = sim(fleet_file(8, step=0.4))
    election = ("--enable-leader-election", "--leader-election-namespace", namespace)
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        first = orchestrators.start(*election, identity="replica-a")
        wait_for("replica-a leads", lambda: lease_holder(kube, namespace) == "replica-a")
        second = orchestrators.start(*election, identity="replica-b")
        wait_for("replica-b waits for the Lease", lambda: standby(second), timeout=60)
        objects.create_cv(
            cluster_version("fleet", fleet.address, ids(8), 6, strategy={"maxConcurrency": 2})
        )
        wait_for(
            "replica-a upgrades clusters",
            lambda: any(c == "replica-a" for c, _ in fleet.calls),
            timeout=60,
        )
        stopped_at = time.monotonic()
        assert first.stop() == 0
        wait_for(
            "replica-b takes over",
            lambda: lease_holder(kube, namespace) == "replica-b",
            timeout=30,
            interval=0.05,
        )
        took = time.monotonic() - stopped_at
        # Without the release replica-b would wait for the 15 s lease to expire (at least 13 s
        # after the SIGTERM); with it, about one retry period (2 s) after replica-a's exit.
        assert took < 9, took
        wait_for(
            "the rollout completes under replica-b",
            lambda: objects.cv_phase_is("fleet", "Completed"),
            timeout=90,
            interval=0.2,
        )
    finally:
        kube.close()
    assert any(c == "replica-b" for c, _ in fleet.calls)
    m = fleet.monitor()
    assert m["clusters_at_target"] == 8 and m["duplicate_mutations"] == 0, m
    assert m["min_available_in_service"] >= 6, m
    assert not reconcile_errors(orchestrators.logs())
