"""The bridge over real gRPC in front of an original-protocol server: inventory, a whole upgrade
walk, idempotency (also across a restart with --state), polling to the end, upstream failures."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc, identity_pb2
from plugins.legacy.state import SUFFIX, Pending, SentState
from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.legacy.conftest import IDS, NEW, OLD, POOLS, StartBridge, client_of
from tests.support.kube import wait_for
from tests.support.legacy_server import (
    SERVICE_IN,
    SERVICE_OUT,
    UPGRADE_MASTER,
    UPGRADE_NODE_POOL,
    LegacyServer,
)

Cap = identity_pb2.PluginCapability
State = cluster_pb2.OperationState
TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)
C0, C1 = IDS[0], IDS[1]


def _terminal(client: PluginClient, op_id: str, timeout: float = 15.0) -> cluster_pb2.Operation:
    return wait_for(
        f"operation {op_id} ends",
        lambda: (op := client.get_operation(op_id)).state in TERMINAL and op,
        timeout=timeout,
    )


def _error(call: object) -> PluginCallError:
    assert callable(call)
    with pytest.raises(PluginCallError) as caught:
        call()
    return caught.value


# -- inventory ---------------------------------------------------------------------------


def test_inventory_is_read_from_get_version_and_get_cluster_status(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.clusters[C1].service_in = False
    upstream.model.clusters[C1].available = False
    upstream.model.clusters[C1].pools["workers"] = "1.28.4"
    with client_of(start_bridge()) as client:
        clusters = {c.id: c for c in client.list_clusters(page_size=3)}
        assert sorted(clusters) == sorted(IDS)
        c0, c1 = clusters[C0], clusters[C1]
        assert (c0.control_plane_version, c0.in_service, c0.available) == (OLD, True, True)
        assert [(p.name, p.version) for p in c0.node_pools] == [(p, OLD) for p in POOLS]
        assert (c1.in_service, c1.available) == (False, False)
        assert "isAvailable=false" in c1.unavailable_reason
        assert {p.name: p.version for p in c1.node_pools}["workers"] == "1.28.4"
        assert client.get_cluster(C1).in_service is False
        missing = _error(lambda: client.get_cluster("projects/demo/locations/x/clusters/none"))
        assert missing.code is grpc.StatusCode.NOT_FOUND
        assert "--cluster" in missing.message


def test_labels_from_the_clusters_file_select_clusters(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    clusters = {cid: {"stage": "canary" if i == 0 else "main"} for i, cid in enumerate(IDS)}
    with client_of(start_bridge(clusters=clusters)) as client:
        assert [c.id for c in client.list_clusters(match_labels={"stage": "canary"})] == [C0]
        assert len(client.list_clusters(match_labels={"stage": "main"})) == 3


def test_a_cluster_the_upstream_cannot_read_is_shown_unavailable_from_its_last_reading(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    with client_of(start_bridge()) as client:
        assert len(client.list_clusters()) == 4
        del upstream.model.clusters[C1]  # the upstream forgot it: GetVersion answers an error
        listed = {c.id: c for c in client.list_clusters()}
        assert listed[C1].available is False
        assert "cannot read it now" in listed[C1].unavailable_reason
        assert all(listed[c].available for c in IDS if c != C1)


# -- operations --------------------------------------------------------------------------


def test_a_whole_upgrade_walk_reaches_the_target_with_one_upstream_call_per_step(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    with client_of(start_bridge()) as client:
        watch = client.watch_operations([C0], include_in_flight=True)
        seen: list[cluster_pb2.Operation] = []
        reader = threading.Thread(target=lambda: seen.extend(watch), daemon=True)
        reader.start()
        steps = [
            lambda: client.service_out("walk-out", C0),
            lambda: client.upgrade_control_plane("walk-cp", C0, NEW),
            *(
                (lambda pool=pool: client.upgrade_node_pool(f"walk-{pool}", C0, pool, NEW))
                for pool in POOLS
            ),
            lambda: client.service_in("walk-in", C0),
        ]
        ops = []
        for step in steps:
            op = step()
            assert op.state == cluster_pb2.OPERATION_STATE_RUNNING
            done = _terminal(client, op.id)
            assert done.state == cluster_pb2.OPERATION_STATE_SUCCEEDED, done.error_message
            assert done.HasField("end_time") and done.progress_percent == 100
            ops.append(done)
        wait_for("the watch saw every end", lambda: sum(o.state in TERMINAL for o in seen) == 5)
        watch.cancel()
    after = upstream.model.snapshot(C0)
    assert (after.master, after.pools, after.service_in) == (NEW, dict.fromkeys(POOLS, NEW), True)
    assert [s.type for s in upstream.model.started] == [
        SERVICE_OUT,
        UPGRADE_MASTER,
        UPGRADE_NODE_POOL,
        UPGRADE_NODE_POOL,
        SERVICE_IN,
    ]
    for op in ops:  # the watch delivered RUNNING then SUCCEEDED for each, in order
        states = [o.state for o in seen if o.id == op.id]
        assert states == [
            cluster_pb2.OPERATION_STATE_RUNNING,
            cluster_pb2.OPERATION_STATE_SUCCEEDED,
        ]


def test_the_same_request_id_returns_the_same_operation_and_calls_the_upstream_once(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    with client_of(start_bridge()) as client:
        first = client.upgrade_control_plane("same-1", C0, NEW)
        again = client.upgrade_control_plane("same-1", C0, NEW)
        assert again.id == first.id
        reused = _error(lambda: client.upgrade_control_plane("same-1", C0, "1.30.0"))
        assert reused.code is grpc.StatusCode.INVALID_ARGUMENT and "request_id" in reused.message
        busy = _error(lambda: client.service_out("other-1", C0))
        assert busy.code is grpc.StatusCode.ABORTED and first.id in busy.message
        done = _terminal(client, first.id)
        assert client.upgrade_control_plane("same-1", C0, NEW).state == done.state
    assert upstream.model.count(UPGRADE_MASTER, C0) == 1
    assert upstream.model.count(SERVICE_OUT) == 0


def test_a_request_with_nothing_to_do_succeeds_at_once_without_an_upstream_call(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.clusters[C1].service_in = False
    with client_of(start_bridge()) as client:
        cp = client.upgrade_control_plane("noop-cp", C0, OLD)
        pool = client.upgrade_node_pool("noop-np", C0, "workers", OLD)
        out = client.service_out("noop-out", C1)
        for op in (cp, pool, out):
            assert op.state == cluster_pb2.OPERATION_STATE_SUCCEEDED and op.HasField("end_time")
        missing = _error(lambda: client.upgrade_node_pool("noop-x", C0, "gpu", NEW))
        assert missing.code is grpc.StatusCode.NOT_FOUND
        assert "default-pool, workers" in missing.message
    assert upstream.model.started == []


def test_an_upstream_failure_fails_the_operation_naming_the_upstream_operation(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.fail_next(UPGRADE_MASTER, C0)
    with client_of(start_bridge()) as client:
        op = client.upgrade_control_plane("fails-1", C0, NEW)
        done = _terminal(client, op.id)
    upstream_id = next(iter(upstream.model.operations))
    assert done.state == cluster_pb2.OPERATION_STATE_FAILED
    assert done.error_code == "UPSTREAM_FAILED"
    assert upstream_id in done.error_message and "UPGRADE_MASTER" in done.error_message
    assert upstream.model.snapshot(C0).master == OLD


def test_a_refusal_by_the_upstream_is_failed_precondition_and_a_retry_calls_again(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.refuse["ServiceOut"] = grpc.StatusCode.FAILED_PRECONDITION
    with client_of(start_bridge()) as client:
        refused = _error(lambda: client.service_out("refused-1", C0))
        assert refused.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "ServiceOut" in refused.message and upstream.address in refused.message
        assert refused.retryable is False
        del upstream.model.refuse["ServiceOut"]
        op = client.service_out("refused-1", C0)  # nothing was started: the same id may go on
        assert _terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.count(SERVICE_OUT, C0) == 1


def test_one_connection_serves_every_upstream_call(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    with client_of(start_bridge()) as client:
        for _ in range(3):
            client.list_clusters()
        op = client.service_out("conn-1", C0)
        _terminal(client, op.id)
    assert len(upstream.model.peers) == 1, upstream.model.peers


# -- durability --------------------------------------------------------------------------


def test_the_same_request_id_returns_the_same_operation_after_a_restart_with_state(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path
) -> None:
    state_file.parent.mkdir()
    upstream.model.ticks_per_operation = 10_000  # stays RUNNING until the test lets it end
    first_bridge = start_bridge(state_file=str(state_file))
    with client_of(first_bridge) as client:
        assert Cap.PLUGIN_CAPABILITY_DURABLE_OPERATIONS in client.capabilities()
        first = client.upgrade_control_plane("durable-1", C0, NEW)
        assert first.state == cluster_pb2.OPERATION_STATE_RUNNING
    first_bridge.stop(0)
    # What was sent upstream sits next to the SDK's operation journal until the operation ends.
    sent = json.loads(Path(f"{state_file}{SUFFIX}").read_text())
    (record,) = sent["operations"]
    assert (record["op_id"], record["request_id"]) == (first.id, "durable-1")
    assert record["upstream"]["type"] == UPGRADE_MASTER
    assert record["upstream"]["operation_id"] in upstream.model.operations

    sent_path = f"{state_file}{SUFFIX}"
    second_bridge = start_bridge(state_file=str(state_file))
    with client_of(second_bridge) as client:
        again = client.upgrade_control_plane("durable-1", C0, NEW)
        assert again.id == first.id and again.state == cluster_pb2.OPERATION_STATE_RUNNING
        assert client.get_cluster(C0).current_operation.id == first.id
        busy = _error(lambda: client.service_out("durable-2", C0))
        assert busy.code is grpc.StatusCode.ABORTED and first.id in busy.message
        with upstream.model.lock:
            for op in upstream.model.operations.values():
                op.ticks_left = 1
        done = _terminal(client, first.id)
        assert done.state == cluster_pb2.OPERATION_STATE_SUCCEEDED
        assert client.upgrade_control_plane("durable-1", C0, NEW).id == first.id
        wait_for("the record is dropped", lambda: not SentState(sent_path, "").all())
    assert upstream.model.count(UPGRADE_MASTER, C0) == 1
    assert upstream.model.snapshot(C0).master == NEW


def test_finished_operations_are_remembered_across_a_restart(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path
) -> None:
    state_file.parent.mkdir()
    bridge = start_bridge(state_file=str(state_file))
    with client_of(bridge) as client:
        op = client.service_out("remember-1", C0)
        done = _terminal(client, op.id)
        noop = client.upgrade_control_plane("remember-2", C0, OLD)
    bridge.stop(0)
    with client_of(start_bridge(state_file=str(state_file))) as client:
        assert client.get_operation(op.id) == done
        assert client.service_out("remember-1", C0) == done
        assert client.upgrade_control_plane("remember-2", C0, OLD).id == noop.id
    assert upstream.model.count(SERVICE_OUT, C0) == 1


def test_without_state_the_bridge_does_not_declare_durable_operations(
    start_bridge: StartBridge,
) -> None:
    with client_of(start_bridge()) as client:
        caps = client.capabilities()
    assert Cap.PLUGIN_CAPABILITY_DURABLE_OPERATIONS not in caps
    assert Cap.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE not in caps
    assert Cap.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL in caps


def test_an_intent_left_by_a_crash_is_never_sent_again_and_fails_as_outcome_unknown(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path
) -> None:
    # What a bridge leaves when it stops between writing the request and the upstream's answer.
    state_file.parent.mkdir()
    sent = SentState(f"{state_file}{SUFFIX}", upstream.address)
    for rid, cid in (("crash-1", C0), ("crash-2", C1)):
        kind = cluster_pb2.OPERATION_KIND_SERVICE_OUT
        sent.put(Pending(request_id=rid, op_id=f"legacy-{rid}", kind=kind, cluster_id=cid))
    upstream.model.clusters[C1].service_in = False  # crash-2's call had reached the upstream
    with client_of(start_bridge(state_file=str(state_file), unknown_grace=0.5)) as client:
        unknown = _terminal(client, "legacy-crash-1")
        reached = _terminal(client, "legacy-crash-2")
        assert client.service_out("crash-1", C0).id == "legacy-crash-1"
    assert unknown.state == cluster_pb2.OPERATION_STATE_FAILED
    assert unknown.error_code == "OUTCOME_UNKNOWN" and C0 in unknown.error_message
    assert reached.state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.started == []


def test_an_unwritable_state_file_refuses_the_mutation_before_the_upstream_is_called(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path
) -> None:
    state_file.parent.mkdir()
    with client_of(start_bridge(state_file=str(state_file))) as client:
        blocker = Path(f"{state_file}{SUFFIX}")
        blocker.mkdir()  # the rename onto it fails (chmod would not stop root)
        refused = _error(lambda: client.service_out("nowrite-1", C0))
        blocker.rmdir()
        assert refused.code is grpc.StatusCode.UNAVAILABLE
        assert "state file" in refused.message
        op = client.service_out("nowrite-1", C0)
        assert _terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.count(SERVICE_OUT, C0) == 1


def test_a_mutation_cut_off_by_the_bridge_stopping_is_sent_once_by_the_next_bridge(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path
) -> None:
    # The bridge stops (its upstream channel closed) after the cluster was read and before
    # the mutation went out: nothing reached the upstream, so nothing may be followed as sent.
    state_file.parent.mkdir()
    first = start_bridge(state_file=str(state_file))
    observe = first.inventory.observe

    def observe_then_stop(cluster_id: str) -> object:
        seen = observe(cluster_id)
        first.upstream.close()
        return seen

    first.inventory.observe = observe_then_stop  # type: ignore[method-assign,assignment]
    with client_of(first) as client:
        cut = _error(lambda: client.service_out("cut-1", C0))
    assert cut.code is grpc.StatusCode.UNAVAILABLE, cut
    assert upstream.model.started == []
    assert SentState(f"{state_file}{SUFFIX}", "").all() == []
    first.stop(0)
    with client_of(start_bridge(state_file=str(state_file))) as client:
        op = client.service_out("cut-1", C0)
        assert _terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.count(SERVICE_OUT, C0) == 1


def test_a_state_file_of_something_else_is_refused_at_start(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    journal = tmp_path / "other.json"
    journal.write_text('{"pb": "not an operation"}\n{}\n')
    with pytest.raises(ValueError, match=r"state: .*other.json:1 is not an operation journal"):
        start_bridge(state_file=str(journal))
    Path(f"{tmp_path / 'fresh.json'}{SUFFIX}").write_text('{"format": 1, "requests": {}}')
    with pytest.raises(ValueError, match=r"--state: .*is not a file of fleet-plugin-legacy"):
        start_bridge(state_file=str(tmp_path / "fresh.json"))


# -- the upstream misbehaving ------------------------------------------------------------


def test_upstream_down_answers_unavailable_and_operations_resume_when_it_returns(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.ticks_per_operation = 20
    bridge = start_bridge(upstream_timeout=1.0)
    with client_of(bridge) as client, grpc.insecure_channel(bridge.address) as plain:
        op = client.service_out("down-1", C0)
        upstream.stop()
        # A channel without our client's retries: what the bridge answers to each call.
        stub = cluster_pb2_grpc.ClusterServiceStub(plain)
        for call in (
            lambda: stub.ListClusters(cluster_pb2.ListClustersRequest(), timeout=10),
            lambda: stub.GetCluster(cluster_pb2.GetClusterRequest(cluster_id=C1), timeout=10),
            lambda: stub.ServiceOut(
                cluster_pb2.ServiceOutRequest(request_id="down-2", cluster_id=C1), timeout=10
            ),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE, caught.value
            details = caught.value.details() or ""
            assert upstream.address in details and "retry" in details
        probe = client.probe()
        assert probe.ready is False and upstream.address in probe.message
        assert client.get_operation(op.id).state == cluster_pb2.OPERATION_STATE_RUNNING
        upstream.start()
        assert _terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
        assert client.probe().ready is True
        after = client.service_out("down-2", C1)
        assert _terminal(client, after.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.count(SERVICE_OUT) == 2


def test_an_operation_the_upstream_forgot_fails_unless_the_cluster_got_there(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.ticks_per_operation = 10_000
    with client_of(start_bridge(unknown_grace=0.5)) as client:
        out = client.service_out("forgot-1", C0)
        cp = client.upgrade_control_plane("forgot-2", C1, NEW)
        upstream.model.forget_operations()  # an upstream restarted without memory
        upstream.model.clusters[C0].service_in = False  # ... after C0 had gone out
        forgot_out, forgot_cp = _terminal(client, out.id), _terminal(client, cp.id)
    assert forgot_out.state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert forgot_cp.state == cluster_pb2.OPERATION_STATE_FAILED
    assert forgot_cp.error_code == "OPERATION_UNKNOWN"
    assert "UNKNOWN" in forgot_cp.error_message and C1 in forgot_cp.error_message


def test_a_call_that_times_out_is_not_repeated_and_succeeds_when_the_cluster_gets_there(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.delay["ServiceOut"] = 1.5  # the upstream acts, but after our deadline
    with client_of(start_bridge(upstream_timeout=0.5, unknown_grace=30)) as client:
        op = client.service_out("slow-1", C0)
        assert op.state == cluster_pb2.OPERATION_STATE_RUNNING
        assert client.service_out("slow-1", C0).id == op.id
        assert _terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.count(SERVICE_OUT, C0) == 1


def test_a_watch_resumed_after_a_restart_is_told_to_resync_and_sees_the_end(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path
) -> None:
    upstream.model.ticks_per_operation = 10_000
    first_bridge = start_bridge(state_file=str(state_file))
    with client_of(first_bridge) as client:
        watch = client.watch_operation_changes([C0])
        changes = iter(watch)
        op = client.service_out("resume-1", C0)
        seen = next(changes)
        assert (seen.operation.id, seen.resync) == (op.id, False) and seen.revision > 0
        watch.cancel()
    first_bridge.stop(0)
    with client_of(start_bridge(state_file=str(state_file))) as client:
        watch = client.watch_operation_changes([C0], since_revision=seen.revision)
        changes = iter(watch)
        replayed = next(changes)  # another incarnation: its revisions cannot be replayed
        assert replayed.resync is True and replayed.operation.id == op.id
        assert replayed.revision > seen.revision
        with upstream.model.lock:
            for upstream_op in upstream.model.operations.values():
                upstream_op.ticks_left = 1
        end = next(c for c in changes if c.operation.state in TERMINAL)
        watch.cancel()
    assert end.operation.id == op.id and end.resync is False
    assert end.operation.state == cluster_pb2.OPERATION_STATE_SUCCEEDED


def test_an_upstream_that_acts_at_once_without_an_operation_id_is_followed_by_the_cluster(
    upstream: LegacyServer, start_bridge: StartBridge
) -> None:
    upstream.model.synchronous = {SERVICE_OUT, SERVICE_IN}
    with client_of(start_bridge()) as client:
        out = client.service_out("sync-1", C0)
        assert out.state == cluster_pb2.OPERATION_STATE_RUNNING
        assert _terminal(client, out.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
        assert client.get_cluster(C0).in_service is False
        back = client.service_in("sync-2", C0)
        assert _terminal(client, back.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert upstream.model.count(SERVICE_OUT, C0) == upstream.model.count(SERVICE_IN, C0) == 1
    assert upstream.model.snapshot(C0).service_in is True
