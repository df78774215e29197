"""OperationStore: request_id idempotency, one operation per cluster, terminal states, watch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.errors import Conflict, InvalidArgument, NotFound
from plugins.sdk.operations import OperationStore

CP = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
NP = cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL
OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
PENDING = cluster_pb2.OPERATION_STATE_PENDING
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
FAILED = cluster_pb2.OPERATION_STATE_FAILED


class _StreamContext:
    """The two ServicerContext methods watch() uses, for driving it without a server."""

    def __init__(self) -> None:
        self._active = True
        self._callbacks: list[Callable[[], None]] = []

    def is_active(self) -> bool:
        return self._active

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._callbacks.append(callback)
        return True

    def cancel(self) -> None:
        self._active = False
        for callback in self._callbacks:
            callback()


def _ctx(context: _StreamContext) -> grpc.ServicerContext:
    return context  # type: ignore[return-value]


def test_same_request_id_returns_the_same_operation_and_creates_one() -> None:
    store = OperationStore()
    first, created = store.start(request_id="r1", kind=CP, cluster_id="c1", target_version="1.29.4")
    again, created_again = store.start(
        request_id="r1", kind=CP, cluster_id="c1", target_version="1.29.4"
    )
    assert created and not created_again
    assert again.id == first.id
    assert first.state == PENDING and first.request_id == "r1"
    assert first.start_time.seconds > 0 and not first.HasField("end_time")


def test_operation_ids_follow_the_request_id_across_stores() -> None:
    a, _ = OperationStore("sim").start(request_id="r-x", kind=OUT, cluster_id="c1")
    b, _ = OperationStore("sim").start(request_id="r-x", kind=OUT, cluster_id="c1")
    c, _ = OperationStore("sim").start(request_id="r-y", kind=OUT, cluster_id="c1")
    assert a.id == b.id != c.id
    assert a.id.startswith("sim-")


def test_request_id_reused_for_another_request_is_invalid() -> None:
    store = OperationStore()
    store.start(request_id="r1", kind=CP, cluster_id="c1", target_version="1.29.4")
    with pytest.raises(InvalidArgument) as err:
        store.start(request_id="r1", kind=CP, cluster_id="c1", target_version="1.30.1")
    assert err.value.field == "request_id"
    assert err.value.message.startswith("request_id: reused for a different request")


def test_second_request_for_a_busy_cluster_conflicts_and_names_the_operation() -> None:
    store = OperationStore()
    first, _ = store.start(request_id="r1", kind=CP, cluster_id="c1", target_version="1.29.4")
    with pytest.raises(Conflict) as err:
        store.start(request_id="r2", kind=NP, cluster_id="c1", node_pool="p", target_version="1")
    assert err.value.operation_id == first.id
    assert first.id in err.value.message
    # Another cluster is free.
    _, created = store.start(request_id="r3", kind=OUT, cluster_id="c2")
    assert created


def test_terminal_state_frees_the_cluster_and_freezes_the_operation() -> None:
    store = OperationStore()
    op, _ = store.start(request_id="r1", kind=CP, cluster_id="c1", target_version="1.29.4")
    running = store.update(op.id, state=RUNNING, progress=40)
    assert running.state == RUNNING and running.progress_percent == 40
    assert store.in_flight("c1") is not None
    done = store.update(op.id, state=FAILED, error_code="UPGRADE_FAILED", error_message="boom")
    assert done.state == FAILED and done.error_code == "UPGRADE_FAILED"
    assert done.HasField("end_time")
    assert store.in_flight("c1") is None
    assert store.update(op.id, state=SUCCEEDED) == done  # terminal: unchanged
    nxt, created = store.start(request_id="r2", kind=CP, cluster_id="c1", target_version="1.29.4")
    assert created and nxt.id != op.id


def test_terminal_initial_state_is_never_in_flight() -> None:
    store = OperationStore()
    op, created = store.start(request_id="r1", kind=OUT, cluster_id="c1", initial_state=SUCCEEDED)
    assert created and op.state == SUCCEEDED and op.progress_percent == 100
    assert op.HasField("end_time")
    assert store.in_flight("c1") is None
    assert store.all_in_flight() == []


def test_get_and_lookup() -> None:
    store = OperationStore()
    op, _ = store.start(request_id="r1", kind=OUT, cluster_id="c1", op_id="provider/op-7")
    assert op.id == "provider/op-7"
    assert store.get("provider/op-7") == op
    assert store.lookup("r1") == op
    assert store.lookup("r2") is None
    with pytest.raises(NotFound, match="operation nope not found"):
        store.get("nope")
    with pytest.raises(NotFound):
        store.update("nope", state=RUNNING)


def test_returned_operations_are_copies() -> None:
    store = OperationStore()
    op, _ = store.start(request_id="r1", kind=OUT, cluster_id="c1")
    op.state = FAILED
    assert store.get(op.id).state == PENDING


def test_watch_starts_with_in_flight_and_delivers_every_update_of_its_clusters() -> None:
    store = OperationStore()
    a, _ = store.start(request_id="a", kind=OUT, cluster_id="c1")
    store.start(request_id="b", kind=OUT, cluster_id="c2")
    context = _StreamContext()
    stream = store.watch(["c1"], include_in_flight=True, context=_ctx(context))
    assert next(stream).id == a.id
    store.update(a.id, state=RUNNING)
    store.update(store.get(store.lookup("b").id).id, state=RUNNING)  # type: ignore[union-attr]
    store.update(a.id, state=SUCCEEDED)
    assert next(stream).state == RUNNING
    last = next(stream)
    assert (last.cluster_id, last.state) == ("c1", SUCCEEDED)
    context.cancel()
    assert list(stream) == []


def test_watch_loses_nothing_under_concurrent_updates() -> None:
    store = OperationStore()
    seed, _ = store.start(request_id="seed", kind=OUT, cluster_id="seed")
    context = _StreamContext()
    stream = store.watch([], include_in_flight=True, context=_ctx(context))
    assert next(stream).id == seed.id  # the watcher is registered from here on
    received: list[cluster_pb2.Operation] = []
    consumer = threading.Thread(target=lambda: received.extend(stream))
    consumer.start()

    def _produce(worker: int) -> None:
        for i in range(50):
            op, _ = store.start(request_id=f"w{worker}-{i}", kind=OUT, cluster_id=f"c{worker}")
            store.update(op.id, state=RUNNING)
            store.update(op.id, state=SUCCEEDED)

    producers = [threading.Thread(target=_produce, args=(w,)) for w in range(4)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    store.update(seed.id, state=SUCCEEDED)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not received or received[-1].id != seed.id):
        time.sleep(0.01)
    context.cancel()
    consumer.join(timeout=10)
    assert not consumer.is_alive()
    per_cluster: dict[str, list[int]] = {}
    for op in received:
        per_cluster.setdefault(op.cluster_id, []).append(op.state)
    assert per_cluster.pop("seed") == [SUCCEEDED]
    assert sorted(per_cluster) == ["c0", "c1", "c2", "c3"]
    for states in per_cluster.values():
        assert states == [PENDING, RUNNING, SUCCEEDED] * 50


def test_close_ends_watchers() -> None:
    store = OperationStore()
    context = _StreamContext()
    stream = store.watch([], include_in_flight=True, context=_ctx(context))
    result: list[list[cluster_pb2.Operation]] = []
    thread = threading.Thread(target=lambda: result.append(list(stream)))
    thread.start()
    store.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert list(store.watch([], include_in_flight=True, context=_ctx(_StreamContext()))) == []


def test_ensure_free_raises_the_same_conflict_as_start() -> None:
    store = OperationStore()
    store.ensure_free("c1")
    op, _ = store.start(request_id="r1", kind=OUT, cluster_id="c1")
    with pytest.raises(Conflict) as err:
        store.ensure_free("c1")
    assert err.value.operation_id == op.id
    assert err.value.message == (
        f"cluster c1 has operation {op.id} (service-out) in flight; wait until it ends, then retry"
    )
    store.update(op.id, state=SUCCEEDED)
    store.ensure_free("c1")
