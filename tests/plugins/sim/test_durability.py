"""The sim with --state-dir: operations, request ids and what they did survive a restart."""

from __future__ import annotations

from pathlib import Path

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import small_fleet

SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
PENDING = cluster_pb2.OPERATION_STATE_PENDING
DURABLE = identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS


def test_a_restarted_sim_keeps_its_operations_and_their_effects(
    start_sim: StartSim, tmp_path: Path
) -> None:
    state = str(tmp_path / "state")
    fleet = small_fleet(step=0.05)
    first = start_sim(fleet, state_dir=state)
    assert DURABLE in first.client.capabilities()
    out = first.finish(first.client.service_out("out-c1", "c1"))
    cp = first.finish(first.client.upgrade_control_plane("cp-c2", "c2", "1.29.4"))
    seen = first.client.get_operation(cp.id)
    first.sim.stop(grace=0)
    first.client.close()

    second = start_sim(fleet, state_dir=state)
    client = second.client
    assert client.get_operation(out.id) == out
    assert client.get_operation(seen.id).state == SUCCEEDED
    # The same request_id finds the same operation; nothing new starts.
    again = client.upgrade_control_plane("cp-c2", "c2", "1.29.4")
    assert (again.id, again.state) == (cp.id, SUCCEEDED)
    assert second.sim.monitor.snapshot()["mutations_total"] == 0
    # What the operations did is still true.
    assert not client.get_cluster("c1").in_service
    assert client.get_cluster("c2").control_plane_version == "1.29.4"
    assert client.get_cluster("c3").control_plane_version == "1.28.5"


def test_an_operation_in_flight_at_the_restart_resumes_and_finishes(
    start_sim: StartSim, tmp_path: Path
) -> None:
    state = str(tmp_path / "state")
    slow = small_fleet(step=30.0)
    first = start_sim(slow, state_dir=state)
    op = first.client.upgrade_control_plane("cp-c1", "c1", "1.29.4")
    first.sim.stop(grace=0)
    first.client.close()

    second = start_sim(small_fleet(step=0.1), state_dir=state)
    resumed = second.client.get_operation(op.id)
    assert resumed.state in (PENDING, RUNNING)
    assert second.client.get_cluster("c1").current_operation.id == op.id
    done = second.finish(resumed)
    assert done.state == SUCCEEDED
    assert second.client.get_cluster("c1").control_plane_version == "1.29.4"
    monitor = second.sim.monitor.snapshot()
    assert (monitor["operations_in_flight"], monitor["mutations_total"]) == (0, 0)


def test_a_watch_resumed_across_the_restart_resyncs(start_sim: StartSim, tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    fleet = small_fleet(step=0.05)
    first = start_sim(fleet, state_dir=state)
    op = first.finish(first.client.service_out("out-c1", "c1"))
    watch = first.client.watch_operation_changes(since_revision=1)
    last = next(iter(watch))
    watch.cancel()
    first.sim.stop(grace=0)
    first.client.close()

    second = start_sim(fleet, state_dir=state)
    resumed = second.client.watch_operation_changes(since_revision=last.revision)
    first_response = next(iter(resumed))
    resumed.cancel()
    assert first_response.resync
    assert first_response.revision > last.revision
    assert first_response.operation.id == op.id


def test_without_a_state_dir_the_sim_is_not_durable(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    assert DURABLE not in run.client.capabilities()
