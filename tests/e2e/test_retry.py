"""Issue 11, failure 5b: a retry after a failed health gate is a fresh attempt, consumed once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from orchestrator import api
from tests.e2e.conftest import (
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    metric_checks,
    reconcile_errors,
)
from tests.support.kube import wait_for

QUERY = 'error_ratio{cluster="{{ cluster }}"}'
BAD = 'error_ratio{cluster="cluster-00"}'


def test_retry_after_a_failed_health_gate_gets_fresh_health_and_is_consumed_once(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(
        fleet_file(
            3,
            step=0.2,
            metrics={'error_ratio{cluster="{{cluster}}"}': 0.0},
            per_cluster={"cluster-00": {"metrics": {BAD: 0.5}}},
        )
    )
    orchestrators.start()
    objects.create_cv(
        cluster_version(
            "fleet",
            fleet.address,
            ids(3),
            2,
            strategy={"maxConcurrency": 1},
            healthChecks=metric_checks(QUERY, 0.01, success=2, failure=2),
        )
    )
    run = objects.current_run("fleet")
    wait_for("the rollout halts", lambda: objects.cv_phase_is("fleet", "Halted"), timeout=60)
    first = objects.upgrade_status(run, "cluster-00")
    assert first["phase"] == "Failed" and first["reason"] == "HealthCheckFailed", first
    assert first["attempt"] == 0 and first["health"]["failures"] >= 2, first
    assert fleet.cluster("cluster-00")["inService"] is False  # the gate kept it out
    # The owner fixes the workload, then asks for a retry.
    fleet.fleet.set_health("cluster-00", metrics={BAD: 0.0})
    objects.patch_cv(
        "fleet", {"metadata": {"annotations": {api.ANNOTATION_RETRY_CLUSTERS: "cluster-00"}}}
    )
    wait_for(
        "the rollout completes",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=60,
        interval=0.2,
    )
    time.sleep(2.0)  # quiet period: a retry not consumed would be acted on again here
    retried = objects.upgrade_status(run, "cluster-00")
    assert retried["phase"] == "Upgraded" and retried["attempt"] == 1, retried
    # Fresh health state: the new attempt's analysis starts from nothing, not from 2 failures.
    assert retried["health"]["failures"] == 0 and retried["health"]["passes"] >= 2, retried
    assert api.ANNOTATION_RETRY_CLUSTERS not in (
        objects.cv("fleet")["metadata"].get("annotations") or {}
    )
    assert api.ANNOTATION_RETRY_CLUSTERS not in (
        objects.run(run)["metadata"].get("annotations") or {}
    )
    up_name = objects.upgrades(run)["cluster-00"]["metadata"]["name"]

    def retry_events() -> list[object]:
        return [
            e
            for e in objects.events()
            if e.involved_object.name == up_name and "retry requested" in (e.message or "")
        ]

    wait_for("the retry is recorded as an Event", retry_events, timeout=20)
    assert len(retry_events()) == 1

    # Issue 24: people describe the ClusterVersion they applied. Its run's transitions are
    # recorded there, moved from the UpdateRun (not copied), and a failed cluster and the
    # person's retry of it are told there too, once each.
    def on(kind: str, name: str) -> list[tuple[str, str]]:
        return [
            (e.reason, e.message or "")
            for e in objects.events()
            if e.involved_object.kind == kind and e.involved_object.name == name
        ]

    def cv_says(reason: str, words: str = "") -> bool:
        return any(r == reason and words in m for r, m in on(api.KIND, "fleet"))

    wait_for("the run's end told on the ClusterVersion", lambda: cv_says("RunSucceeded"), 20)
    said = on(api.KIND, "fleet")
    for reason in ("RunStarted", "RunHalted", "StageCompleted", "RunSucceeded"):
        assert cv_says(reason, f"UpdateRun {run}: "), (reason, said)
    assert cv_says("Failed", f"UpdateRun {run}: cluster cluster-00: "), said
    assert sum(1 for _, m in said if "retry requested" in m) == 1, said
    assert Counter(said).most_common(1)[0][1] == 1, said  # one Event per transition
    run_level = {"RunStarted", "RunHalted", "RunSucceeded", "StageStarted", "StageCompleted"}
    assert not [r for r, _ in on(api.UPDATE_RUN_KIND, run) if r in run_level]
    m = fleet.monitor()
    # cluster-00: out, control plane, two pools (attempt 0), then only back in (attempt 1: it
    # was still out of service); cluster-01 and -02 five steps each.
    assert m["mutations_total"] == 4 + 1 + 2 * 5, m
    assert m["clusters_at_target"] == 3 and m["available_in_service"] == 3, m
    assert m["min_available_in_service"] == 2 and m["duplicate_mutations"] == 0, m
    assert not reconcile_errors(orchestrators.logs())
