"""ClusterService of the sim over real gRPC: inventory, operations and the contract's rules."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import small_fleet, wait_until

PENDING = cluster_pb2.OPERATION_STATE_PENDING
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED


def _pools(cluster: cluster_pb2.Cluster) -> dict[str, str]:
    return {p.name: p.version for p in cluster.node_pools}


def test_control_plane_then_node_pool_upgrade_moves_the_versions(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    client = run.client
    op = client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    assert (op.state, op.kind, op.target_version) == (
        PENDING,
        cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
        "1.29.4",
    )
    done = run.finish(op)
    assert done.state == SUCCEEDED and done.progress_percent == 100
    assert done.HasField("end_time")
    cluster = client.get_cluster("c1")
    assert cluster.control_plane_version == "1.29.4"
    assert _pools(cluster) == {"p1": "1.28.5", "p2": "1.28.5"}
    assert not cluster.HasField("current_operation")

    pool_op = run.finish(client.upgrade_node_pool("np-1", "c1", "p2", "1.29.4"))
    assert pool_op.state == SUCCEEDED and pool_op.node_pool == "p2"
    assert _pools(client.get_cluster("c1")) == {"p1": "1.28.5", "p2": "1.29.4"}
    assert client.get_cluster("c2").control_plane_version == "1.28.5"


def test_watch_sees_pending_running_succeeded_and_the_cluster_shows_the_operation(
    start_sim: StartSim,
) -> None:
    run = start_sim(small_fleet(step=1.0))
    client = run.client
    with client.watch_operations(["c1"], include_in_flight=True) as watch:
        op = client.upgrade_control_plane("cp-1", "c1", "1.29.4")
        during = client.get_cluster("c1")
        assert during.current_operation.id == op.id
        states = []
        for update in watch:
            assert update.id == op.id
            states.append(update.state)
            if update.state == RUNNING:
                running = client.get_cluster("c1")
                # A control plane is unavailable while its upgrade runs.
                assert not running.available
                assert running.unavailable_reason == "control plane upgrading to 1.29.4"
            if update.state == SUCCEEDED:
                break
    assert states[0] == PENDING and states[-1] == SUCCEEDED and RUNNING in states
    after = client.get_cluster("c1")
    assert after.available and not after.HasField("current_operation")


def test_node_pool_shows_upgrading_while_it_runs(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(step=1.0))
    client = run.client
    run.finish(client.upgrade_control_plane("cp", "c1", "1.29.4"))
    op = client.upgrade_node_pool("np", "c1", "p1", "1.29.4")

    def _upgrading() -> bool:
        pools = {p.name: p.status for p in client.get_cluster("c1").node_pools}
        return pools["p1"] == cluster_pb2.NODE_POOL_STATUS_UPGRADING

    wait_until(_upgrading, what="p1 UPGRADING")
    run.finish(op)
    statuses = {p.name: p.status for p in client.get_cluster("c1").node_pools}
    assert statuses == {"p1": cluster_pb2.NODE_POOL_STATUS_READY, "p2": 1}


def test_service_out_and_in_flip_in_service(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    client = run.client
    run.finish(client.service_out("out-1", "c2"))
    assert not client.get_cluster("c2").in_service
    run.finish(client.service_in("in-1", "c2"))
    assert client.get_cluster("c2").in_service


def test_a_second_request_for_a_busy_cluster_is_aborted_naming_the_operation(
    start_sim: StartSim,
) -> None:
    run = start_sim(small_fleet(step=2.0))
    client = run.client
    first = client.service_out("out-1", "c1")
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    assert err.value.code == grpc.StatusCode.ABORTED
    assert first.id in err.value.message
    assert err.value.operation_id == first.id
    assert not err.value.retryable
    # Other clusters are not affected.
    assert client.service_out("out-2", "c2").state == PENDING


def test_same_request_id_returns_the_same_operation_and_starts_nothing(
    start_sim: StartSim,
) -> None:
    run = start_sim(small_fleet(step=0.3))
    client = run.client
    first = client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    again = client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    assert again.id == first.id
    done = run.finish(first)
    after = client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    assert after.id == first.id and after.state == SUCCEEDED == done.state
    run.wait_monitor(lambda m: m["operations_in_flight"] == 0, "no operation in flight")
    assert run.monitor()["mutations_total"] == 1
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("cp-1", "c1", "1.29.5")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.message.startswith("request_id: reused for a different request")


def test_requests_with_nothing_to_do_succeed_at_once(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(step=5.0))
    client = run.client
    assert client.upgrade_control_plane("cp", "c1", "v1.28.5").state == SUCCEEDED
    assert client.upgrade_node_pool("np", "c1", "p1", "1.28.5").state == SUCCEEDED
    assert client.service_in("in", "c1").state == SUCCEEDED
    assert not client.get_cluster("c1").HasField("current_operation")


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        (
            lambda c: c.upgrade_node_pool("r", "c1", "p1", "1.29.4"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "cluster c1: node pool p1 cannot be newer than the control plane (1.28.5); "
            "upgrade the control plane to 1.29.4 first",
        ),
        (
            lambda c: c.upgrade_control_plane("r", "c1", "1.27.9"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "cluster c1: control plane is at 1.28.5; downgrading it to 1.27.9 is not supported",
        ),
        (
            lambda c: c.upgrade_control_plane("r", "c1", "1.30.0"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "cluster c1: control plane is at 1.28.5; upgrade one minor version at a time "
            "(next: 1.29)",
        ),
        (
            lambda c: c.upgrade_node_pool("r", "c1", "nope", "1.28.5"),
            grpc.StatusCode.NOT_FOUND,
            "cluster c1 has no node pool 'nope' (node pools: p1, p2)",
        ),
        (
            lambda c: c.service_out("r", "c404"),
            grpc.StatusCode.NOT_FOUND,
            "cluster c404 not found",
        ),
        (lambda c: c.get_cluster("c404"), grpc.StatusCode.NOT_FOUND, "cluster c404 not found"),
        (
            lambda c: c.get_operation("sim-nope"),
            grpc.StatusCode.NOT_FOUND,
            "operation sim-nope not found",
        ),
        (
            lambda c: c.upgrade_control_plane("r", "c1", "latest"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "version: 'latest' is not a version; write it like 1.29.4 or 1.29.4-gke.100",
        ),
        (
            lambda c: c.service_out("", "c1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "request_id: must not be empty; set it to a caller-chosen id, unique per intended "
            "change",
        ),
        (
            lambda c: c.upgrade_node_pool("r", "c1", "", "1.28.5"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "node_pool: must not be empty; set it to a node pool name from the cluster's "
            "node_pools",
        ),
    ],
    ids=[
        "pool-newer-than-control-plane",
        "downgrade",
        "minor-skip",
        "unknown-pool",
        "unknown-cluster-mutation",
        "unknown-cluster-get",
        "unknown-operation",
        "bad-version",
        "empty-request-id",
        "empty-node-pool",
    ],
)
def test_refused_requests_answer_the_contract_code_and_start_nothing(
    start_sim: StartSim, call: object, code: grpc.StatusCode, message: str
) -> None:
    run = start_sim(small_fleet())
    with pytest.raises(PluginCallError) as err:
        call(run.client)  # type: ignore[operator]
    assert (err.value.code, err.value.message) == (code, message)
    assert run.monitor()["mutations_total"] == 0
    assert not run.client.get_cluster("c1").HasField("current_operation")


def test_list_clusters_pages_by_id_with_labels_and_total(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(count=11))
    client = run.client
    everything = client.list_clusters(page_size=3)
    ids = [c.id for c in everything]
    assert ids == sorted(f"c{i}" for i in range(1, 12))
    first = client.list_page(page_size=4)
    assert len(first.clusters) == 4 and first.total_size == 11 and first.next_page_token
    stage_a = client.list_clusters({"stage": "a"}, page_size=2)
    assert [c.id for c in stage_a] == sorted(f"c{i}" for i in range(1, 12, 2))
    page = client.list_page(page_size=2, match_labels={"stage": "a"})
    assert page.total_size == 6
    assert client.list_clusters({"stage": "a", "n": "3"}) == [client.get_cluster("c3")]
    assert client.list_clusters({"stage": "zzz"}) == []
    last = client.list_page(page_size=100)
    assert len(last.clusters) == 11 and last.next_page_token == ""


def test_list_clusters_rejects_foreign_tokens_and_negative_sizes(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    with pytest.raises(PluginCallError) as err:
        run.client.list_page(page_token="not-a-token")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.message.startswith("page_token: ")
    with pytest.raises(PluginCallError) as err:
        run.client.list_page(page_size=-1)
    assert err.value.message.startswith("page_size: ")


def test_list_clusters_shows_state_changes(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    run.finish(run.client.service_out("out", "c2"))
    listed = {c.id: c for c in run.client.list_clusters()}
    assert not listed["c2"].in_service and listed["c1"].in_service


def test_identity_declares_everything_but_gates_and_durability(start_sim: StartSim) -> None:
    from fleetupgrade.plugin.v1 import identity_pb2

    run = start_sim(small_fleet())
    info = run.client.info()
    assert info.name == "sim.fleetupgrade.io"
    assert info.manifest["clusters"] == "3"
    assert run.client.capabilities() == frozenset(
        {
            identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
            identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
            identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
            identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
            identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
            identity_pb2.PLUGIN_CAPABILITY_QUERY_METRIC,
            identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE,
        }
    )
    assert run.client.probe().ready
    with pytest.raises(PluginCallError) as err:
        run.client.list_gates()
    assert err.value.code == grpc.StatusCode.UNIMPLEMENTED
