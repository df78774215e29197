"""Issue 11, failure 1: the health gate holds at scale (40 clusters, 30 in flight at once)."""

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
    metric_checks,
    reconcile_errors,
)
from tests.support.kube import wait_for

QUERY = 'error_ratio{cluster="{{ cluster }}"}'


def test_no_cluster_is_serviced_in_without_passing_checks_at_scale(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    # Every cluster reports an error ratio of 0.5; the stage's check wants at most 0.01.
    fleet = sim(fleet_file(40, step=0.2, metrics={'error_ratio{cluster="{{cluster}}"}': 0.5}))
    orchestrators.start()
    body = cluster_version(
        "fleet",
        fleet.address,
        ids(40),
        10,
        strategy={
            "maxConcurrency": 30,
            "stages": [
                {
                    "name": "all",
                    "clusters": ids(40),
                    "healthChecks": metric_checks(QUERY, 0.01, failure=2),
                }
            ],
        },
    )
    objects.create_cv(body)
    run = objects.current_run("fleet")

    def failed() -> dict[str, dict[str, object]] | None:
        ups = objects.upgrades(run)
        bad = {c: u for c, u in ups.items() if (u.get("status") or {}).get("phase") == "Failed"}
        return bad if len(bad) == 30 else None

    bad = wait_for("30 clusters fail their health gate", failed, timeout=90, interval=0.3)
    wait_for(
        "the rollout halts, the ClusterVersion counting the 30 failed",
        lambda: (s := objects.cv_phase_is("fleet", "Halted")) and s["summary"].get("failed") == 30,
        timeout=30,
    )
    time.sleep(2.0)  # a quiet period in which a controller that skipped the gate would act
    ups = objects.upgrades(run)
    phases = sorted((u.get("status") or {}).get("phase", "Pending") for u in ups.values())
    assert phases.count("Failed") == 30 and phases.count("Pending") == 10, phases
    for cid, up in bad.items():
        st = up["status"]
        assert st["reason"] == "HealthCheckFailed", (cid, st)
        assert "error-ratio" in st["message"] and "0.5" in st["message"], st["message"]
        assert st["health"]["passes"] == 0 and st["health"]["failures"] >= 2, st["health"]
        # Out of service it stays: the gate never let it back in.
        assert fleet.cluster(cid)["inService"] is False, cid
    m = fleet.monitor()
    # 30 clusters x (service-out, control plane, two node pools); not one service-in.
    assert m["mutations_total"] == 30 * 4, m
    assert m["available_in_service"] == 10 and m["min_available_in_service"] == 10, m
    assert m["duplicate_mutations"] == 0
    assert not reconcile_errors(orchestrators.logs())
