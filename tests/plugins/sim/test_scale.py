"""Ten thousand clusters in one sim: listing them all, and thousands of operations on one timer
thread."""

from __future__ import annotations

import threading

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import wait_until


@pytest.mark.slow
def test_ten_thousand_clusters_and_two_thousand_operations_at_once(start_sim: StartSim) -> None:
    run = start_sim(generate=10_000, step_seconds=0.5, monitor_file=None)
    client = run.client
    clusters = client.list_clusters(page_size=5000)
    assert len(clusters) == 10_000
    assert [c.id for c in clusters] == sorted(c.id for c in clusters)
    canary = client.list_clusters({"stage": "canary"})
    assert len(canary) == 200
    threads_before = threading.active_count()
    targets = [c.id for c in clusters[:2000]]
    ops = [client.service_out(f"out-{cid}", cid) for cid in targets]
    assert {op.state for op in ops} <= {
        cluster_pb2.OPERATION_STATE_PENDING,
        cluster_pb2.OPERATION_STATE_RUNNING,
        cluster_pb2.OPERATION_STATE_SUCCEEDED,
    }
    # Operations run on the scheduler thread: no thread per operation.
    assert threading.active_count() <= threads_before + 2
    wait_until(
        lambda: run.sim.monitor.snapshot()["operations_in_flight"] == 0,
        timeout=60,
        what="every service-out to end",
    )
    out = client.list_clusters(page_size=5000)
    assert sum(not c.in_service for c in out) == 2000
    snapshot = run.sim.monitor.snapshot()
    assert snapshot["min_available_in_service"] == 8000
    assert snapshot["mutations_total"] == 2000
