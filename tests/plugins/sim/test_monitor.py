"""The invariant monitor: file and gauges after real calls, and its counting rules."""

from __future__ import annotations

from prometheus_client import generate_latest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginClient
from plugins.sim.monitor import ClusterView, InvariantMonitor, StepKey
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import small_fleet

CP = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
IN = cluster_pb2.OPERATION_KIND_SERVICE_IN


def test_service_out_and_back_is_counted_and_breaks_nothing(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(count=5), target_version="1.29.4")
    initial = run.monitor()
    assert initial["clusters_total"] == 5
    assert initial["available_in_service"] == initial["min_available_in_service"] == 5
    assert initial["clusters_by_version"] == {"1.28.5": 5}
    assert initial["clusters_at_target"] == 0
    run.finish(run.client.service_out("out-c3", "c3"))
    run.finish(run.client.service_in("in-c3", "c3"))
    final = run.wait_monitor(
        lambda m: m["mutations_total"] == 2 and m["operations_in_flight"] == 0, "both ended"
    )
    assert final["available_in_service"] == 5
    assert final["min_available_in_service"] == 4
    assert final["duplicate_mutations"] == 0
    assert final["concurrent_mutators"] == 0
    assert final["operations_failed"] == 0
    assert final["mutating_callers"] == 1


def test_clusters_at_target_and_by_version(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(count=3), target_version="v1.29.4")
    client = run.client
    run.finish(client.upgrade_control_plane("cp", "c1", "1.29.4"))
    partly = run.wait_monitor(
        lambda m: m["clusters_by_version"] == {"1.28.5": 2, "1.29.4": 1}, "c1 moved"
    )
    assert partly["clusters_at_target"] == 0  # its node pools are still at 1.28.5
    for pool in ("p1", "p2"):
        run.finish(client.upgrade_node_pool(f"np-{pool}", "c1", pool, "1.29.4"))
    run.wait_monitor(lambda m: m["clusters_at_target"] == 1, "c1 at target")


def test_a_step_repeated_after_it_succeeded_is_a_duplicate(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(count=2))
    client = run.client
    run.finish(client.upgrade_control_plane("cp-1", "c1", "1.29.4"))
    client.upgrade_control_plane("cp-1", "c1", "1.29.4")  # same request_id: not a duplicate
    assert run.monitor()["duplicate_mutations"] == 0
    again = client.upgrade_control_plane("cp-2", "c1", "1.29.4")  # new request_id, same step
    assert again.state == cluster_pb2.OPERATION_STATE_SUCCEEDED  # nothing to do
    run.wait_monitor(lambda m: m["duplicate_mutations"] == 1, "one duplicate")
    assert run.monitor()["mutations_total"] == 2


def test_retries_after_failure_and_repeated_rounds_are_not_duplicates(start_sim: StartSim) -> None:
    faults = {"failStep": [{"step": "controlPlane", "clusters": ["c1"], "times": 1}]}
    run = start_sim(small_fleet(count=2, faults=faults))
    client = run.client
    failed = run.finish(client.upgrade_control_plane("cp-1", "c1", "1.29.4"))
    assert failed.state == cluster_pb2.OPERATION_STATE_FAILED
    run.finish(client.upgrade_control_plane("cp-2", "c1", "1.29.4"))
    for round_no in range(2):  # out, in, out, in: each undoes the previous
        run.finish(client.service_out(f"out-{round_no}", "c2"))
        run.finish(client.service_in(f"in-{round_no}", "c2"))
    final = run.wait_monitor(lambda m: m["mutations_total"] == 6, "six operations")
    assert final["duplicate_mutations"] == 0
    assert final["operations_failed"] == 1


def test_two_callers_mutating_at_once_are_concurrent_mutators(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(count=3), caller="orchestrator-a")
    run.client.service_out("a-1", "c1")
    run.client.service_out("a-2", "c2")
    assert run.monitor()["concurrent_mutators"] == 0  # one caller, twice
    other = PluginClient(run.sim.address, caller="orchestrator-b")
    try:
        other.service_out("b-1", "c3")
    finally:
        other.close()
    final = run.wait_monitor(lambda m: m["concurrent_mutators"] == 1, "one overlap")
    assert final["mutating_callers"] == 2


def test_prometheus_gauges_match_the_file(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(count=4), target_version="1.29.4")
    run.finish(run.client.service_out("out", "c1"))
    run.wait_monitor(lambda m: m["operations_in_flight"] == 0, "the operation ended")
    text = generate_latest(run.registry).decode()
    lines = set(text.splitlines())
    assert "fleet_sim_min_available_in_service 3.0" in lines
    assert "fleet_sim_available_in_service 3.0" in lines
    assert "fleet_sim_mutations_total 1.0" in lines
    assert "fleet_sim_duplicate_mutations 0.0" in lines
    assert "fleet_sim_concurrent_mutators 0.0" in lines
    assert "fleet_sim_clusters_at_target 0.0" in lines
    assert 'fleet_sim_clusters_by_version{version="1.28.5"} 4.0' in lines
    # The SDK's RPC metrics share the registry.
    assert any(line.startswith("fleet_plugin_rpc_total{") for line in lines)


def _view(up: bool, version: str = "1.28.5") -> ClusterView:
    return ClusterView(up, version, (version,))


def test_monitor_low_water_starts_at_the_loaded_fleet() -> None:
    monitor = InvariantMonitor()
    monitor.add_clusters([_view(True), _view(True), _view(False)])
    assert monitor.snapshot()["min_available_in_service"] == 2
    monitor.cluster_changed(_view(True), _view(False))
    monitor.cluster_changed(_view(False), _view(True))
    snap = monitor.snapshot()
    assert (snap["available_in_service"], snap["min_available_in_service"]) == (2, 1)


def test_monitor_duplicate_rules() -> None:
    monitor = InvariantMonitor()
    cp = StepKey("c1", CP, "", "1.29.4")
    assert not monitor.operation_started(cp, in_flight=True)
    assert not monitor.operation_started(cp, in_flight=True)  # first still running: not done
    monitor.operation_ended(cp, succeeded=True)
    assert monitor.operation_started(StepKey("c1", CP, "", "v1.29.4"), in_flight=False)
    assert not monitor.operation_started(StepKey("c1", CP, "", "1.30.1"), in_flight=True)
    out = StepKey("c1", OUT, "", "")
    assert not monitor.operation_started(out, in_flight=False)
    assert monitor.operation_started(out, in_flight=False)
    assert not monitor.operation_started(StepKey("c1", IN, "", ""), in_flight=False)
    assert not monitor.operation_started(out, in_flight=False)
    assert monitor.snapshot()["duplicate_mutations"] == 2


def test_monitor_concurrency_window() -> None:
    now = [100.0]
    monitor = InvariantMonitor(window_seconds=5.0, clock=lambda: now[0])
    assert not monitor.mutating_call("a")
    now[0] += 1
    assert monitor.mutating_call("b")
    now[0] += 10
    assert not monitor.mutating_call("a")  # b's last call is outside the window
    assert not monitor.mutating_call("a")
    assert monitor.snapshot()["concurrent_mutators"] == 1
