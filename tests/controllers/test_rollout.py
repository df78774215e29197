"""End to end on a real kube-apiserver and the simulated fleet plugin: rollouts converge safely."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from orchestrator import api
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import (
    CV,
    OrchestratorProcess,
    free_port,
    monitor,
    seed_cluster_version,
    simulated_fleet,
)

OLD, NEW = "1.28.5", "1.29.1"


def fleet(n: int, step: float = 0.15, **faults: Any) -> dict[str, Any]:
    return {
        "defaults": {
            "stepSeconds": {
                "serviceOut": step,
                "serviceIn": step,
                "controlPlane": step,
                "nodePool": step,
            },
            "jitter": 0.2,
        },
        "clusters": [
            {
                "id": f"cluster-{i:02d}",
                "labels": {"stage": "canary" if i < 2 else "main"},
                "controlPlaneVersion": OLD,
                "nodePools": [
                    {"name": "default-pool", "version": OLD},
                    {"name": "workers", "version": OLD},
                ],
            }
            for i in range(n)
        ],
        "faults": faults,
    }


def cluster_version(
    name: str, endpoint: str, ids: list[str], required: int, **spec: Any
) -> dict[str, Any]:
    return seed_cluster_version(name, endpoint, ids, NEW, required, **spec)


@pytest.fixture
def orchestrator(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> Iterator[OrchestratorProcess]:
    proc = OrchestratorProcess(control_plane.kubeconfig, namespace, tmp_path / "orchestrator.log")
    yield proc.start()
    assert proc.stop() == 0, "SIGTERM must end the orchestrator cleanly"


def test_twenty_cluster_rollout_keeps_the_floor(
    control_plane: KubeCluster, namespace: str, tmp_path: Path, orchestrator: OrchestratorProcess
) -> None:
    with simulated_fleet(tmp_path, fleet(20), NEW) as sim:
        ids = [f"cluster-{i:02d}" for i in range(20)]
        cvs = CV(control_plane, namespace)
        cvs.create(cluster_version("fleet", sim.address, ids, 15))
        status = wait_for(
            "rollout completes",
            lambda: cvs.phase_is("fleet", "Completed"),
            timeout=120,
            interval=0.2,
        )
        m = monitor(sim)
        assert m["clusters_at_target"] == 20
        assert m["min_available_in_service"] == 15
        assert m["duplicate_mutations"] == 0
        assert m["concurrent_mutators"] == 0
        assert m["mutations_total"] == 20 * 5
        assert status["summary"]["upToDate"] == 20
        assert "clusters" not in status  # at rest: no per-cluster entries
        upgrades = cvs.upgrades("fleet")  # they live on the run's ClusterUpgrades
        assert sorted(upgrades) == ids
        assert {u["status"]["phase"] for u in upgrades.values()} == {"Upgraded"}
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        text = orchestrator.metrics()
        assert 'multicluster_controller_success_operation_total{operation="controlPlane"' in text
        assert "multicluster_controller_success_plugin_call_total" in text


def test_sigkill_mid_rollout_resumes_without_duplicates(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    with simulated_fleet(tmp_path, fleet(12, step=0.3), NEW) as sim:
        ids = [f"cluster-{i:02d}" for i in range(12)]
        cvs = CV(control_plane, namespace)
        first = OrchestratorProcess(control_plane.kubeconfig, namespace, tmp_path / "o1.log")
        first.start()
        try:
            cvs.create(cluster_version("fleet", sim.address, ids, 9))
            wait_for(
                "a few clusters upgraded",
                lambda: (cvs.status("fleet").get("summary") or {}).get("upToDate", 0) >= 3,
                timeout=60,
                interval=0.05,
            )
        finally:
            first.kill()
        in_flight = monitor(sim)["mutations_total"]
        assert 0 < in_flight < 12 * 5
        second = OrchestratorProcess(control_plane.kubeconfig, namespace, tmp_path / "o2.log")
        second.start()
        try:
            wait_for(
                "rollout completes",
                lambda: cvs.phase_is("fleet", "Completed"),
                timeout=120,
                interval=0.2,
            )
        finally:
            second.stop()
        m = monitor(sim)
        assert m["clusters_at_target"] == 12
        assert m["duplicate_mutations"] == 0
        # The second process carried on the first one's run and attempts.
        assert [r["name"] for r in cvs.status("fleet")["runs"]] == [
            cvs.status("fleet")["currentRun"]
        ]
        upgrades = cvs.upgrades("fleet")
        assert {(u["status"]["phase"], u["status"]["attempt"]) for u in upgrades.values()} == {
            ("Upgraded", 0)
        }
        assert m["min_available_in_service"] >= 9
        assert m["mutations_total"] == 12 * 5


def test_failed_upgrade_halts_and_touches_nothing_else(
    control_plane: KubeCluster, namespace: str, tmp_path: Path, orchestrator: OrchestratorProcess
) -> None:
    faults = {
        "failStep": [
            {
                "step": "controlPlane",
                "clusters": ["cluster-00"],
                "message": "etcd quorum lost during upgrade",
            }
        ]
    }
    with simulated_fleet(tmp_path, fleet(4, **faults), NEW) as sim:
        ids = [f"cluster-{i:02d}" for i in range(4)]
        cvs = CV(control_plane, namespace)
        cvs.create(cluster_version("fleet", sim.address, ids, 3))
        status = wait_for("rollout halts", lambda: cvs.phase_is("fleet", "Halted"), timeout=60)
        failed = cvs.failed("fleet")
        assert list(failed) == ["cluster-00"]
        assert failed["cluster-00"]["reason"] == "OperationFailed"
        assert "etcd quorum lost during upgrade" in failed["cluster-00"]["message"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and ready["reason"] == "Halted"
        assert "cluster-00" in ready["message"] and "etcd quorum lost" in ready["message"]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "ClusterFailed"
        run = cvs.current_run("fleet")
        assert run is not None and run["status"]["phase"] == "Halted"
        time.sleep(1.5)  # give a misbehaving controller the chance to touch another cluster
        m = monitor(sim)
        assert m["mutations_total"] == 2  # serviceOut + the failed controlPlane of cluster-00
        assert m["clusters_by_version"] == {OLD: 4}
        others = {
            cid: (o.get("status") or {}).get("phase", "Pending")
            for cid, o in cvs.upgrades("fleet").items()
            if cid != "cluster-00"
        }
        assert others == dict.fromkeys(["cluster-01", "cluster-02", "cluster-03"], "Pending")


def test_invalid_spec_is_marked_and_nothing_is_mutated(
    control_plane: KubeCluster, namespace: str, tmp_path: Path, orchestrator: OrchestratorProcess
) -> None:
    with simulated_fleet(tmp_path, fleet(3), NEW) as sim:
        cvs = CV(control_plane, namespace)
        body = cluster_version("fleet", sim.address, ["cluster-00", "cluster-01", "nope"], 2)
        body["spec"]["clusters"][1]["version"] = "1.27.0"
        cvs.create(body)
        status = wait_for("marked invalid", lambda: cvs.phase_is("fleet", "Invalid"), timeout=30)
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "InvalidSpec"
        assert "spec.clusters[2].id" in ready["message"]
        assert "spec.clusters[1].version" in ready["message"] and "downgrade" in ready["message"]
        assert monitor(sim)["mutations_total"] == 0


def test_schema_rejects_bad_endpoint_and_version(
    control_plane: KubeCluster, namespace: str
) -> None:
    cvs = CV(control_plane, namespace)
    body = cluster_version("bad", "not an endpoint", ["a", "b"], 1)
    body["spec"]["clusters"][0]["version"] = "latest"
    with pytest.raises(k8s.ApiException) as err:
        cvs.create(body)
    assert err.value.status == 422
    assert "spec.opsEndpoint.endpoint" in str(err.value.body)
    assert "spec.clusters.version" in str(err.value.body)  # 1.20 omits the list index


def test_unreachable_plugin_marks_degraded_then_recovers(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    port = free_port()
    cvs = CV(control_plane, namespace)
    ids = ["cluster-00", "cluster-01", "cluster-02"]
    cvs.create(cluster_version("fleet", f"127.0.0.1:{port}", ids, 2))

    def degraded() -> dict[str, Any] | None:
        conds = cvs.status("fleet").get("conditions") or []
        found = next((c for c in conds if c["type"] == "Degraded"), None)
        return found if found and found["status"] == "True" else None

    cond = wait_for("marked Degraded", degraded, timeout=60, interval=0.2)
    assert cond["reason"] == "PluginUnavailable"
    assert f"127.0.0.1:{port}" in cond["message"] and "UNAVAILABLE" in cond["message"]
    run = cvs.current_run("fleet")  # the run says so first; the ClusterVersion shows it
    assert run is not None
    run_cond = next(c for c in run["status"]["conditions"] if c["type"] == "Degraded")
    assert run_cond["status"] == "True" and run_cond["reason"] == "PluginUnavailable"
    assert cvs.upgrades("fleet") == {}  # nothing pinned without the plugin's inventory
    with simulated_fleet(tmp_path, fleet(3), NEW, listen=f"127.0.0.1:{port}") as sim:
        status = wait_for(
            "rollout completes once the plugin is up",
            lambda: cvs.phase_is("fleet", "Completed"),
            timeout=120,
            interval=0.2,
        )
        assert monitor(sim)["clusters_at_target"] == 3
        degraded_now = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded_now["status"] == "False"
        run = cvs.current_run("fleet")
        assert run is not None
        run_cond = next(c for c in run["status"]["conditions"] if c["type"] == "Degraded")
        assert run_cond["status"] == "False"


def test_a_plugin_down_mid_run_fails_the_step_in_flight_at_its_bound(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    """Invariant 4 with the run's one plugin gone while a cluster is out of service
    (simulation seeds 81718, 85618): the run is Degraded, nothing else is started, and the
    cluster's step fails at its bound, saying why; it is not left in its step for as long as
    the plugin stays down."""
    port = free_port()
    slow = fleet(3)
    slow["defaults"]["stepSeconds"]["controlPlane"] = 8.0
    cvs = CV(control_plane, namespace)
    ids = ["cluster-00", "cluster-01", "cluster-02"]
    body = cluster_version("fleet", f"127.0.0.1:{port}", ids, 2, timeouts={"controlPlane": "20s"})
    with simulated_fleet(tmp_path, slow, NEW, listen=f"127.0.0.1:{port}"):
        cvs.create(body)

        def upgrading() -> str | None:
            for cid, o in cvs.upgrades("fleet").items():
                if (o.get("status") or {}).get("phase") == "UpgradingControlPlane":
                    return cid
            return None

        cid = wait_for("a control plane upgrading", upgrading, timeout=60, interval=0.1)
    # The plugin is gone, its operation with it.
    gone_at = time.monotonic()

    def run_degraded() -> dict[str, Any] | None:
        run = cvs.current_run("fleet") or {}
        conds = (run.get("status") or {}).get("conditions") or []
        found = next((c for c in conds if c["type"] == "Degraded"), None)
        return found if found and found["status"] == "True" else None

    cond = wait_for("the run Degraded", run_degraded, timeout=30, interval=0.2)
    assert cond["reason"] == "PluginUnavailable"
    assert f"127.0.0.1:{port}" in cond["message"] and "UNAVAILABLE" in cond["message"]

    def failed() -> dict[str, Any] | None:
        st = cvs.upgrade("fleet", cid).get("status") or {}
        return st if st.get("phase") == "Failed" else None

    st = wait_for("the step failed at its bound", failed, timeout=60, interval=0.5)
    assert st["reason"] == "ProviderUnavailable"
    assert "did not answer within the step's bound" in st["message"]
    assert st["step"] == "controlPlane"  # still ours to bring back: a retry carries it on
    assert time.monotonic() - gone_at < 45
    others = {
        c: (o.get("status") or {}).get("phase", "Pending")
        for c, o in cvs.upgrades("fleet").items()
        if c != cid
    }
    assert set(others.values()) <= {"Pending"}, others


def test_events_record_each_clusters_start_and_end(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    core = k8s.CoreV1Api(control_plane.api_client())
    with simulated_fleet(tmp_path, fleet(3), NEW) as sim:
        cvs = CV(control_plane, namespace)
        cvs.create(cluster_version("fleet", sim.address, [f"cluster-{i:02d}" for i in range(3)], 2))
        wait_for(
            "rollout completes",
            lambda: cvs.phase_is("fleet", "Completed"),
            timeout=60,
            interval=0.2,
        )

        upgrades = cvs.upgrades("fleet")
        by_name = {o["metadata"]["name"]: cid for cid, o in upgrades.items()}

        def events() -> list[Any]:
            return [
                e
                for e in core.list_namespaced_event(namespace).items
                if e.involved_object.kind == api.CLUSTER_UPGRADE_KIND
                and e.involved_object.name in by_name
            ]

        wait_for(
            "an Upgraded event per cluster",
            lambda: len([e for e in events() if e.reason == "Upgraded"]) >= 3,
            timeout=30,
        )
        # One event per transition, on each cluster's own ClusterUpgrade: by default its start
        # and its end (its status records the steps between; --step-events adds an Event for
        # each, tests/notify/test_notifications_e2e.py). Event times have one-second resolution, so
        # the order is not asserted; each transition appears once.
        lifecycle = {"ServicingOut", "Upgraded"}
        for name, cid in by_name.items():
            mine = [e for e in events() if e.involved_object.name == name]
            reasons = Counter(e.reason for e in mine)
            assert set(reasons) == lifecycle, (cid, reasons)
            assert max(reasons.values()) == 1, (cid, reasons)
            assert all(e.type == "Normal" for e in mine)
            assert all(e.involved_object.uid == upgrades[cid]["metadata"]["uid"] for e in mine)


def test_retry_annotation_resumes_a_halted_rollout(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    faults = {
        "failStep": [
            {
                "step": "controlPlane",
                "clusters": ["cluster-00"],
                "times": 1,
                "message": "transient quota error",
            }
        ]
    }
    with simulated_fleet(tmp_path, fleet(3, **faults), NEW) as sim:
        cvs = CV(control_plane, namespace)
        cvs.create(
            cluster_version("fleet", sim.address, ["cluster-00", "cluster-01", "cluster-02"], 2)
        )
        wait_for("rollout halts", lambda: cvs.phase_is("fleet", "Halted"), timeout=60)
        cvs.api.patch_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            "fleet",
            {"metadata": {"annotations": {api.ANNOTATION_RETRY_CLUSTERS: "cluster-00"}}},
        )
        wait_for(
            "rollout completes",
            lambda: cvs.phase_is("fleet", "Completed"),
            timeout=90,
            interval=0.2,
        )
        annotations = cvs.get("fleet")["metadata"].get("annotations") or {}
        assert api.ANNOTATION_RETRY_CLUSTERS not in annotations  # consumed
        run = cvs.current_run("fleet")
        assert run is not None
        assert api.ANNOTATION_RETRY_CLUSTERS not in (run["metadata"].get("annotations") or {})
        retried = cvs.upgrade("fleet", "cluster-00")["status"]
        assert retried["phase"] == "Upgraded" and retried["attempt"] == 1
        m = monitor(sim)
        assert m["clusters_at_target"] == 3 and m["duplicate_mutations"] == 0
        assert m["operations_failed"] == 1


def test_a_retry_that_fails_again_is_not_retried_again(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    faults = {"failStep": [{"step": "controlPlane", "clusters": ["cluster-00"], "times": 2}]}
    with simulated_fleet(tmp_path, fleet(3, **faults), NEW) as sim:
        cvs = CV(control_plane, namespace)
        cvs.create(
            cluster_version("fleet", sim.address, ["cluster-00", "cluster-01", "cluster-02"], 2)
        )
        wait_for("rollout halts", lambda: cvs.phase_is("fleet", "Halted"), timeout=60)
        cvs.api.patch_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            "fleet",
            {"metadata": {"annotations": {api.ANNOTATION_RETRY_CLUSTERS: "cluster-00"}}},
        )

        def failed_again() -> dict[str, Any] | None:
            entry = cvs.failed("fleet").get("cluster-00") or {}
            return entry if entry.get("attempt") == 1 else None

        wait_for("the retry fails again", failed_again, timeout=60, interval=0.1)
        time.sleep(2)  # room for a wrong second retry
        status = cvs.status("fleet")
        entry = cvs.upgrade("fleet", "cluster-00")["status"]
        assert entry["phase"] == "Failed" and entry["attempt"] == 1
        assert status["phase"] == "Halted"
        assert monitor(sim)["operations_failed"] == 2
        annotations = cvs.get("fleet")["metadata"].get("annotations") or {}
        assert api.ANNOTATION_RETRY_CLUSTERS not in annotations
