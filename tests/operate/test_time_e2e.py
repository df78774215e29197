"""Issue 12: time on the real stack: a closed maintenance window holds a cluster and its opening
releases it (clusters with an open window go first), and a scheduled start (notBefore).

How time is made controllable: the orchestrator process, the sim plugin and the test share the
machine's clock, and every instant that matters is placed a few seconds after the test's now
(the sim's per-cluster provider windows and notBefore have second precision). Nothing sleeps
for a real window: the tests poll with deadlines a few seconds long. This needs no test-only
clock in the product; the windows' calendar rules (days, RRULEs, zones, DST) are covered on a
simulated clock by tests/windows and tests/sim.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from orchestrator.engine.conditions import format_time, parse_time
from tests.e2e.conftest import (
    NEW,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import wait_for


def _ready(orchestrators: Orchestrators) -> None:
    """Start the orchestrator and wait for its /readyz (its startup is no part of a wait)."""
    proc = orchestrators.start()

    def ready() -> bool:
        try:
            url = f"http://127.0.0.1:{proc.metrics_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for("the orchestrator is ready", ready, timeout=90, interval=0.2)


def _soon(seconds: int) -> datetime:
    """A whole second `seconds` from now (status times have second precision)."""
    return datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds + 1)


def test_a_closed_window_holds_a_cluster_until_it_opens_and_open_ones_go_first(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(3, step=0.2))
    _ready(orchestrators)
    # Placed once everything runs (startup time under load is not part of the window).
    opens = _soon(12)
    later = {"kind": "window", "name": "later", "start": format_time(opens)}
    later["end"] = format_time(opens + timedelta(minutes=30))
    now_open = {"kind": "window", "name": "now", "start": format_time(opens - timedelta(hours=1))}
    now_open["end"] = format_time(opens + timedelta(minutes=30))
    per_cluster = {
        "cluster-00": {"maintenanceWindows": [later]},
        "cluster-01": {"maintenanceWindows": [now_open]},
        "cluster-02": {"maintenanceWindows": [now_open]},
    }
    fleet.rewrite(fleet_file(3, step=0.2, per_cluster=per_cluster))
    maintenance = {"providerWindows": "Windows", "expectedDuration": "5m"}
    objects.create_cv(
        cluster_version(
            "fleet",
            fleet.address,
            ids(3),
            2,
            strategy={"maxConcurrency": 1, "maintenance": maintenance},
        )
    )
    run = objects.current_run("fleet")

    def held() -> dict[str, object] | None:
        status = objects.run(run).get("status") or {}
        ups = objects.upgrades(run)
        done = all(
            (ups.get(c, {}).get("status") or {}).get("phase") == "Upgraded"
            for c in ("cluster-01", "cluster-02")
        )
        return status if done and status.get("waitingReason") == "MaintenanceWindow" else None

    status = wait_for("the open-window clusters done, cluster-00 held", held, timeout=60)
    assert datetime.now(UTC) < opens, "the test machine is too slow for a 12 s window"
    assert status["nextStartTime"] == format_time(opens), status
    st = objects.upgrade_status(run, "cluster-00")
    assert (st["phase"], st["reason"]) == ("Pending", "MaintenanceWindow"), st
    assert format_time(opens) in st["message"], st
    assert fleet.cluster("cluster-00")["inService"] is True
    wait_for(
        "the window opens and the rollout completes",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=60,
        interval=0.2,
    )
    ups = objects.upgrades(run)
    started = {c: parse_time(ups[c]["status"]["startTime"]) for c in ids(3)}
    assert started["cluster-00"] >= opens, started
    assert max(started["cluster-01"], started["cluster-02"]) < opens, started
    assert all(fleet.cluster(c)["controlPlaneVersion"] == NEW for c in ids(3))
    assert fleet.monitor()["min_available_in_service"] >= 2
    assert not reconcile_errors(orchestrators.logs())


def test_a_scheduled_start_holds_every_cluster_until_not_before(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(3, step=0.2))
    _ready(orchestrators)
    not_before = _soon(10)
    objects.create_cv(
        cluster_version(
            "fleet",
            fleet.address,
            ids(3),
            2,
            strategy={"maxConcurrency": 1, "notBefore": format_time(not_before)},
        )
    )
    run = objects.current_run("fleet")
    status = wait_for(
        "the run waits for its scheduled start",
        lambda: (
            (s := objects.run(run).get("status") or {}).get("waitingReason") == "NotBefore" and s
        ),
        timeout=30,
        interval=0.2,
    )
    assert status["nextStartTime"] == format_time(not_before), status
    time.sleep(1.0)  # a quiet period in which a wrong controller would start a cluster
    assert datetime.now(UTC) < not_before, "the test machine is too slow for a 10 s wait"
    assert fleet.monitor()["mutations_total"] == 0
    st = objects.upgrade_status(run, "cluster-00")
    assert (st["phase"], st["reason"]) == ("Pending", "NotBefore"), st
    wait_for(
        "the rollout completes after notBefore",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=60,
        interval=0.2,
    )
    ups = objects.upgrades(run)
    assert all(parse_time(ups[c]["status"]["startTime"]) >= not_before for c in ids(3))
    assert all(fleet.cluster(c)["controlPlaneVersion"] == NEW for c in ids(3))
    assert not reconcile_errors(orchestrators.logs())
