"""Injected faults over real gRPC: failed steps, UNAVAILABLE, hanging RPCs, flaps, regressions."""

from __future__ import annotations

import time

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc, health_pb2
from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import small_fleet, wait_until

SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
FAILED = cluster_pb2.OPERATION_STATE_FAILED


def test_fail_step_fails_the_operation_and_changes_nothing(start_sim: StartSim) -> None:
    faults = {"failStep": [{"step": "controlPlane", "clusters": ["c1"]}]}
    run = start_sim(small_fleet(faults=faults))
    client = run.client
    for attempt in range(2):
        op = run.finish(client.upgrade_control_plane(f"cp-{attempt}", "c1", "1.29.4"))
        assert op.state == FAILED
        assert op.error_code == "UPGRADE_FAILED"
        assert op.error_message == (
            "simulated failure: control-plane upgrade on cluster c1 failed (fault failStep)"
        )
    cluster = client.get_cluster("c1")
    assert cluster.control_plane_version == "1.28.5" and cluster.available
    # Other clusters and other steps are unaffected.
    assert run.finish(client.upgrade_control_plane("cp-c2", "c2", "1.29.4")).state == SUCCEEDED
    assert run.finish(client.service_out("out-c1", "c1")).state == SUCCEEDED
    run.wait_monitor(lambda m: m["operations_failed"] == 2, "two failed operations")


def test_fail_step_times_then_succeeds_with_custom_code(start_sim: StartSim) -> None:
    faults = {
        "failStep": [
            {
                "step": "nodePool",
                "clusters": ["c1"],
                "nodePool": "p2",
                "times": 2,
                "errorCode": "NODE_POOL_UPGRADE_FAILED",
                "message": "gpu nodes failed to drain",
            }
        ]
    }
    run = start_sim(small_fleet(faults=faults))
    client = run.client
    run.finish(client.upgrade_control_plane("cp", "c1", "1.29.4"))
    # p1 is not named by the fault.
    assert run.finish(client.upgrade_node_pool("p1", "c1", "p1", "1.29.4")).state == SUCCEEDED
    outcomes = []
    for attempt in range(3):
        op = run.finish(client.upgrade_node_pool(f"p2-{attempt}", "c1", "p2", "1.29.4"))
        outcomes.append((op.state, op.error_code, op.error_message))
    assert outcomes == [
        (FAILED, "NODE_POOL_UPGRADE_FAILED", "gpu nodes failed to drain"),
        (FAILED, "NODE_POOL_UPGRADE_FAILED", "gpu nodes failed to drain"),
        (SUCCEEDED, "", ""),
    ]
    pools = {p.name: (p.version, p.status) for p in client.get_cluster("c1").node_pools}
    assert pools == {
        "p1": ("1.29.4", cluster_pb2.NODE_POOL_STATUS_READY),
        "p2": ("1.29.4", cluster_pb2.NODE_POOL_STATUS_READY),
    }


def test_unavailable_rate_answers_unavailable_for_that_share_of_calls(start_sim: StartSim) -> None:
    faults = {"unavailableRate": 0.5, "unavailableMethods": ["GetCluster"]}
    run = start_sim(small_fleet(faults=faults), seed=3)
    # A bare stub (no retry policy) sees every UNAVAILABLE the sim answers.
    with grpc.insecure_channel(run.sim.address) as channel:
        stub = cluster_pb2_grpc.ClusterServiceStub(channel)
        codes = []
        for _ in range(200):
            try:
                stub.GetCluster(cluster_pb2.GetClusterRequest(cluster_id="c1"), timeout=5)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    unavailable = codes.count(grpc.StatusCode.UNAVAILABLE)
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert 60 <= unavailable <= 140, unavailable
    # Methods outside unavailableMethods are never refused.
    for _ in range(50):
        run.client.list_clusters()


def test_unavailable_rate_one_exhausts_the_client_retries(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(faults={"unavailableRate": 1.0}))
    with pytest.raises(PluginCallError) as err:
        run.client.get_cluster("c1")
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.retryable
    assert "fault unavailableRate" in err.value.message
    assert run.client.probe().ready  # IdentityService is never refused


def test_hang_rpc_outlasts_a_short_deadline_then_stops_after_times(start_sim: StartSim) -> None:
    faults = {"hangRpc": [{"method": "QueryMetric", "seconds": 30, "times": 1}]}
    run = start_sim(small_fleet(faults=faults))
    impatient = PluginClient(run.sim.address, timeouts={"QueryMetric": 0.3})
    try:
        started = time.monotonic()
        with pytest.raises(PluginCallError) as err:
            impatient.query_metric("q", {}, "c1")
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 5
        answer = impatient.query_metric("q", {}, "c1")  # the hang was used up
        assert not answer.has_data
    finally:
        impatient.close()


def test_availability_flaps_toggle_available(start_sim: StartSim) -> None:
    faults = {"availabilityFlaps": [{"clusters": ["c2"], "period": 0.3, "down": 0.3}]}
    run = start_sim(small_fleet(faults=faults))
    client = run.client

    def _down() -> cluster_pb2.Cluster | None:
        cluster = client.get_cluster("c2")
        return None if cluster.available else cluster

    down = wait_until(_down, what="c2 unavailable")
    assert down.unavailable_reason == "simulated availability flap (fault availabilityFlaps)"
    wait_until(lambda: client.get_cluster("c2").available, what="c2 available again")
    assert client.get_cluster("c1").available
    # The monitor saw the cluster (in service) drop out.
    assert run.monitor()["min_available_in_service"] == 2


def test_unhealthy_after_upgrade_turns_workloads_and_metrics_bad(start_sim: StartSim) -> None:
    query = 'error_ratio{cluster="{{cluster}}"}'
    fleet = small_fleet(
        faults={
            "unhealthyAfterUpgrade": [
                {"clusters": ["c1"], "metrics": {'error_ratio{cluster="c1"}': 0.3}}
            ]
        }
    )
    fleet["defaults"]["workloads"] = [
        {"namespace": "shop", "name": "web", "healthyReplicas": 2, "health": 1.0}
    ]
    fleet["defaults"]["metrics"] = {query: 0.001}
    run = start_sim(fleet)
    client = run.client
    workload = health_pb2.Workload(namespace="shop", name="web")

    def _verdicts() -> list[int]:
        return [r.health for r in client.check_workloads(["c1", "c2"], [workload])]

    healthy = health_pb2.WORKLOAD_HEALTH_HEALTHY
    assert _verdicts() == [healthy, healthy]
    assert client.query_metric(query, {}, "c1").value == pytest.approx(0.001)
    for cluster_id in ("c1", "c2"):
        run.finish(client.upgrade_control_plane(f"cp-{cluster_id}", cluster_id, "1.29.4"))
    assert _verdicts() == [health_pb2.WORKLOAD_HEALTH_UNHEALTHY, healthy]
    assert client.query_metric(query, {}, "c1").value == pytest.approx(0.3)
    assert client.query_metric(query, {}, "c2").value == pytest.approx(0.001)
