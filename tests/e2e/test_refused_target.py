"""Issue 11, failure 4: a target the provider refuses drains nothing and says why."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.e2e.conftest import (
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import wait_for

SKIPPED_MINOR = "1.30.2"  # from 1.28.5: the sim refuses it (FAILED_PRECONDITION, minor skipped)


@pytest.mark.parametrize(("on_failure", "phase"), [("Halt", "Halted"), ("Continue", "Failed")])
def test_refused_target_takes_nothing_out_and_the_run_says_why(
    on_failure: str,
    phase: str,
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
) -> None:
    fleet = sim(fleet_file(4, step=0.2))
    orchestrators.start()
    body = cluster_version(
        "fleet", fleet.address, ids(4), 2, strategy={"maxConcurrency": 2, "onFailure": on_failure}
    )
    for entry in body["spec"]["clusters"]:
        entry["version"] = SKIPPED_MINOR
    objects.create_cv(body)
    run = objects.current_run("fleet")

    def blocked() -> dict[str, dict[str, object]] | None:
        ups = objects.upgrades(run)
        done = all((u.get("status") or {}).get("phase") == "Blocked" for u in ups.values())
        return ups if len(ups) == 4 and done else None

    ups = wait_for("every cluster Blocked", blocked, timeout=60, interval=0.2)
    time.sleep(2.0)  # a quiet period in which a wrong controller would start draining
    for cid, up in objects.upgrades(run).items():
        st = up["status"]
        assert st["phase"] == "Blocked" and st["reason"] == "Refused", (cid, st)
        assert "MINOR_VERSION_SKIP" in st["message"], st["message"]
        assert "one minor version at a time" in st["message"], st["message"]
    m = fleet.monitor()
    assert m["mutations_total"] == 0, m  # not one cluster taken out of service
    assert m["min_available_in_service"] == 4, m
    assert all(fleet.cluster(c)["inService"] for c in ids(4))
    # The run and the ClusterVersion say why nothing moves.
    run_status = objects.run(run)["status"]
    assert "refuse" in run_status["message"].lower(), run_status
    assert run_status["counts"]["blocked"] == 4, run_status
    cv = wait_for(
        "the ClusterVersion says why",
        lambda: (s := objects.cv_status("fleet")).get("message") == run_status["message"] and s,
        timeout=20,
    )
    assert cv["phase"] == phase, cv  # not Progressing: nothing will ever progress
    assert not reconcile_errors(orchestrators.logs())
    assert len(ups) == 4
