"""Issue 12: people operating a rollout on the real stack, declaratively (GitOps, no CLI): a
cluster skipped in spec.skip and a stage in the skip-stages annotation of the ClusterVersion
(both handed to its current run in place), stop and resume of the run mid-stage with the floor
kept (the sim's own monitor), and a spec.retry round reaching Upgraded, applied once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from orchestrator import api
from tests.e2e.conftest import (
    NEW,
    OLD,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import wait_for


def _patch_run(objects: Objects, name: str, patch: dict[str, Any]) -> None:
    objects.api.patch_namespaced_custom_object(
        api.GROUP, api.VERSION, objects.ns, api.UPDATE_RUN_PLURAL, name, patch
    )


def _phase(objects: Objects, run: str, cid: str) -> str:
    return str(objects.upgrade_status(run, cid).get("phase", "Pending"))


def test_a_skipped_cluster_and_a_skipped_stage_are_recorded_and_never_touched(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(6, step=0.2))
    orchestrators.start()
    stages = [
        {"name": "first", "clusters": ids(2)},
        {"name": "second", "clusters": ids(4)[2:], "approval": "Manual"},
        {"name": "third", "clusters": ids(6)[4:]},
    ]
    objects.create_cv(
        cluster_version(
            "fleet", fleet.address, ids(6), 4, strategy={"maxConcurrency": 1, "stages": stages}
        )
    )
    run = objects.current_run("fleet")
    wait_for(
        "stage second awaits approval",
        lambda: any(
            s["name"] == "second" and s["phase"] == "AwaitingApproval"
            for s in (objects.run(run).get("status") or {}).get("stages") or []
        ),
        timeout=60,
        interval=0.2,
    )
    # A person skips the stage waiting for approval (annotation, as `skip --stage` writes it)
    # and a cluster of the last stage (spec.skip, as a GitOps repository holds it).
    objects.patch_cv(
        "fleet",
        {
            "metadata": {
                "annotations": {
                    api.ANNOTATION_SKIP_STAGES: "second",
                    api.ANNOTATION_REQUESTED_BY: "bob",
                    api.ANNOTATION_REASON: "bad batch",
                }
            },
            "spec": {
                "skip": {
                    "clusters": ["cluster-05"],
                    "reason": "customer freeze",
                    "requestedBy": "alice",
                }
            },
        },
    )
    wait_for(
        "the rollout completes",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=60,
        interval=0.2,
    )
    status = objects.run(run)["status"]
    assert status["phase"] == "Succeeded", status
    assert [s["phase"] for s in status["stages"]] == ["Completed", "Skipped", "Completed"]
    ups = objects.upgrades(run)
    for cid in ("cluster-02", "cluster-03"):
        st = ups[cid]["status"]
        assert (st["phase"], st["reason"]) == ("Skipped", "StageSkipped"), st
        # No admission webhook in this stack: who asked is recorded as unauthenticated, the
        # typed names only as display names (issue 24; tests/webhook/test_requested_by.py has
        # the authenticated path).
        assert st["message"] == "skipped by unauthenticated (as bob): bad batch (stage second)", st
    st = ups["cluster-05"]["status"]
    assert (st["phase"], st["reason"]) == ("Skipped", "SkippedByUser"), st
    assert st["message"] == "skipped by unauthenticated (as alice): customer freeze", st
    for cid in ("cluster-02", "cluster-03", "cluster-05"):
        assert fleet.cluster(cid)["controlPlaneVersion"] == OLD
        assert fleet.cluster(cid)["inService"] is True
    for cid in ("cluster-00", "cluster-01", "cluster-04"):
        assert ups[cid]["status"]["phase"] == "Upgraded"
        assert fleet.cluster(cid)["controlPlaneVersion"] == NEW
    # The run got the ClusterVersion's skip in place (no new run).
    assert objects.run(run)["spec"]["skip"]["clusters"] == ["cluster-05"]
    assert len(objects.runs()) == 1
    assert not reconcile_errors(orchestrators.logs())


def test_stop_and_resume_mid_stage_keep_the_floor(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(8, step=0.4))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(8), 6, strategy={"maxConcurrency": 2})
    )
    run = objects.current_run("fleet")
    wait_for(
        "two clusters upgraded, more in flight",
        lambda: sum(_phase(objects, run, c) == "Upgraded" for c in ids(8)) >= 2,
        timeout=60,
        interval=0.1,
    )
    _patch_run(objects, run, {"spec": {"state": "Stop"}})
    wait_for(
        "the run stops",
        lambda: objects.run_phase_is(run, "Stopped"),
        timeout=60,
        interval=0.2,
    )
    time.sleep(1.0)  # a quiet period in which a wrong controller would start another cluster
    assert all(fleet.cluster(c)["inService"] for c in ids(8)), "a cluster left out at the stop"
    at_old = [c for c in ids(8) if fleet.cluster(c)["controlPlaneVersion"] == OLD]
    assert at_old, "stopped mid-stage: some clusters not started"
    m = fleet.monitor()
    assert m["operations_in_flight"] == 0, m
    status = objects.run(run)["status"]
    assert status["waitingReason"] == "Stopped", status
    _patch_run(objects, run, {"spec": {"state": "Run"}})
    wait_for(
        "the resumed run completes",
        lambda: objects.run_phase_is(run, "Succeeded"),
        timeout=90,
        interval=0.2,
    )
    assert all(fleet.cluster(c)["controlPlaneVersion"] == NEW for c in ids(8))
    assert all(fleet.cluster(c)["inService"] for c in ids(8))
    m = fleet.monitor()
    assert m["min_available_in_service"] >= 6, m  # the floor held through stop and resume
    assert m["duplicate_mutations"] == 0 and m["concurrent_mutators"] == 0, m
    assert not reconcile_errors(orchestrators.logs())


def test_a_spec_retry_round_reaches_upgraded_and_is_applied_once(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    faults = {"failStep": [{"step": "controlPlane", "clusters": ["cluster-00"], "times": 2}]}
    fleet = sim(fleet_file(3, step=0.2, faults=faults))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(3), 2, strategy={"maxConcurrency": 1})
    )
    run = objects.current_run("fleet")
    wait_for("the rollout halts", lambda: objects.cv_phase_is("fleet", "Halted"), timeout=60)
    first = objects.upgrade_status(run, "cluster-00")
    assert (first["phase"], first["attempt"]) == ("Failed", 0), first

    def retry(round_: int, reason: str) -> None:
        objects.patch_cv(
            "fleet",
            {
                "spec": {
                    "retry": {
                        "clusters": ["cluster-00"],
                        "round": round_,
                        "reason": reason,
                        "requestedBy": "carol",
                    }
                }
            },
        )

    # Round 1: the second injected failure fails it again; re-applied, round 1 is spent.
    retry(1, "flaky control plane")
    wait_for(
        "round 1 fails again",
        lambda: (
            (s := objects.upgrade_status(run, "cluster-00")).get("retryRound") == 1
            and s.get("phase") == "Failed"
            and s.get("attempt") == 1
        ),
        timeout=60,
        interval=0.2,
    )
    retry(1, "re-sync of the same round")
    time.sleep(2.0)  # a quiet period in which a non-idempotent round would retry again
    again = objects.upgrade_status(run, "cluster-00")
    assert (again["phase"], again["attempt"], again["retryRound"]) == ("Failed", 1, 1), again
    # Round 2: a fresh attempt with the run's pinned target reaches Upgraded.
    retry(2, "fixed")
    wait_for(
        "the rollout completes",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=60,
        interval=0.2,
    )
    done = objects.upgrade_status(run, "cluster-00")
    assert (done["phase"], done["attempt"], done["retryRound"]) == ("Upgraded", 2, 2), done
    assert fleet.cluster("cluster-00")["controlPlaneVersion"] == NEW
    assert objects.run(run)["spec"]["retry"]["round"] == 2  # handed over in place
    assert len(objects.runs()) == 1
    assert fleet.monitor()["min_available_in_service"] >= 2
    assert not reconcile_errors(orchestrators.logs())
