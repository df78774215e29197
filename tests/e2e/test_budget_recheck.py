"""Issue 11, failure 5a: a service-out issued again after a failed call passes the budget again."""

from __future__ import annotations

import time
from collections.abc import Callable

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


def test_reissued_service_out_is_checked_against_the_budget_again(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    failing = {"rpcErrors": [{"method": "ServiceOut", "code": "UNAVAILABLE"}]}
    fleet = sim(fleet_file(4, step=0.3, faults=failing))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(4), 3, strategy={"maxConcurrency": 1})
    )
    run = objects.current_run("fleet")
    wait_for(
        "the first service-out of cluster-00 fails and is to be asked again",
        lambda: (
            "will ask again" in (objects.upgrade_status(run, "cluster-00").get("message") or "")
        ),
        timeout=60,
    )
    # Meanwhile another cluster goes down: taking cluster-00 out now would break the floor.
    fleet.fleet.set_health("cluster-03", available=False, unavailable_reason="node outage")
    # The orchestrator re-checks the budget before it asks again (not after a failed call):
    # once it has seen the outage, the service-out goes back to waiting. Only then does the
    # plugin answer again (earlier, a pass that read the inventory just before the outage
    # could still ask, through no fault of the check under test).
    wait_for(
        "the re-issue is held back by the budget",
        lambda: objects.upgrade_status(run, "cluster-00").get("reason") == "WaitingForBudget",
        timeout=60,
    )
    fleet.rewrite(fleet_file(4, step=0.3))  # the plugin answers ServiceOut again
    time.sleep(5.0)  # quiet period: several retry intervals (2 s) in which a re-issue would go out
    m = fleet.monitor()
    assert m["min_available_in_service"] == 3, m  # only cluster-03's own outage
    assert m["mutations_total"] == 0, m
    assert fleet.cluster("cluster-00")["inService"] is True
    held = objects.upgrade_status(run, "cluster-00")
    assert held["phase"] == "Pending" and held["reason"] == "WaitingForBudget", held
    fleet.fleet.set_health("cluster-03", available=True)
    wait_for(
        "the rollout completes once cluster-03 is back",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=90,
        interval=0.2,
    )
    m = fleet.monitor()
    assert m["min_available_in_service"] == 3 and m["clusters_at_target"] == 4, m
    assert m["duplicate_mutations"] == 0, m
    assert not reconcile_errors(orchestrators.logs())
