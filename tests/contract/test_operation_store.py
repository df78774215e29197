"""OperationStore: revisions, replay from since_revision, resync, and the durable journal."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginClient
from plugins.sdk.errors import Unavailable
from plugins.sdk.identity import StaticIdentity
from plugins.sdk.operations import OperationStore
from plugins.sdk.server import PluginServicers
from plugins.sdk.servicers import ClusterServicer
from tests.contract.conftest import StartServer

OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
CP = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
PENDING = cluster_pb2.OPERATION_STATE_PENDING
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
FAILED = cluster_pb2.OPERATION_STATE_FAILED
Response = cluster_pb2.WatchOperationsResponse


class _Context:
    """The ServicerContext methods a watch uses, to drive one without a server."""

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


def _take(
    store: OperationStore, count: int, since: int = 0, clusters: Sequence[str] = ()
) -> list[Response]:
    """The first count responses of a changes() stream, then cancels it."""
    context = _Context()
    stream = store.changes(clusters, True, context, since)  # type: ignore[arg-type]
    taken = [next(stream) for _ in range(count)]
    context.cancel()
    assert list(stream) == []
    return taken


def _run_op(store: OperationStore, request_id: str, cluster_id: str, end: int = SUCCEEDED) -> str:
    op, _ = store.start(request_id=request_id, kind=OUT, cluster_id=cluster_id)
    store.update(op.id, state=RUNNING, progress=50)
    store.update(op.id, state=end, error_code="X" if end == FAILED else "", error_message="x")
    return op.id


def test_every_change_gets_a_strictly_greater_revision() -> None:
    store = OperationStore()
    base = store.revision
    _run_op(store, "a", "c1")
    _run_op(store, "b", "c2")
    changes = _take(store, 6, since=base)
    revisions = [c.revision for c in changes]
    assert revisions == sorted(set(revisions))
    assert revisions[0] > base
    assert revisions[-1] == store.revision
    assert [c.operation.state for c in changes[:3]] == [PENDING, RUNNING, SUCCEEDED]
    assert not any(c.resync for c in changes)


def test_since_revision_replays_exactly_the_changes_after_it() -> None:
    store = OperationStore()
    _run_op(store, "a", "c1")
    seen = store.revision
    second = _run_op(store, "b", "c2")
    third, _ = store.start(request_id="c", kind=CP, cluster_id="c1", target_version="1.30.1")
    replay = _take(store, 4, since=seen)
    assert [(c.operation.id, c.operation.state) for c in replay] == [
        (second, PENDING),
        (second, RUNNING),
        (second, SUCCEEDED),
        (third.id, PENDING),
    ]
    assert all(c.revision > seen and not c.resync for c in replay)
    only_c1 = _take(store, 1, since=seen, clusters=["c1"])
    assert only_c1[0].operation.id == third.id


def test_a_replayed_stream_goes_live_without_a_gap() -> None:
    store = OperationStore()
    op, _ = store.start(request_id="a", kind=OUT, cluster_id="c1")
    seen = store.revision
    context = _Context()
    stream = store.changes([], False, context, seen)  # type: ignore[arg-type]
    received: list[Response] = []
    reader = threading.Thread(target=lambda: received.extend(stream))
    reader.start()
    store.update(op.id, state=RUNNING)
    store.update(op.id, state=SUCCEEDED)
    deadline = threading.Event()
    for _ in range(200):
        if len(received) == 2:
            break
        deadline.wait(0.01)
    context.cancel()
    reader.join(timeout=5)
    assert [c.operation.state for c in received] == [RUNNING, SUCCEEDED]


@pytest.mark.parametrize("where", ["evicted", "other-process", "future"])
def test_a_revision_that_cannot_be_replayed_resyncs_with_every_retained_operation(
    where: str,
) -> None:
    store = OperationStore(retention=4)
    first = store.revision + 1
    a = _run_op(store, "a", "c1")
    b = _run_op(store, "b", "c2")
    in_flight, _ = store.start(request_id="c", kind=OUT, cluster_id="c3")
    since = {"evicted": first, "other-process": 12345, "future": store.revision + 100}[where]
    changes = _take(store, 3, since=since)
    assert [c.resync for c in changes] == [True, False, False]
    assert {c.operation.id: c.operation.state for c in changes} == {
        a: SUCCEEDED,
        b: SUCCEEDED,
        in_flight.id: PENDING,
    }
    assert [c.revision for c in changes] == sorted(c.revision for c in changes)


def test_a_revision_of_a_restarted_store_is_never_replayed() -> None:
    old = OperationStore()
    _run_op(old, "a", "c1")
    new = OperationStore()
    op, _ = new.start(request_id="x", kind=OUT, cluster_id="c9")
    assert new.revision > old.revision
    changes = _take(new, 1, since=old.revision)
    assert changes[0].resync
    assert changes[0].operation.id == op.id


def test_resync_is_flagged_on_the_first_live_change_when_nothing_is_retained() -> None:
    store = OperationStore()
    context = _Context()
    stream = store.changes([], False, context, 99)  # type: ignore[arg-type]
    received: list[Response] = []
    reader = threading.Thread(target=lambda: received.extend(stream))
    reader.start()
    _run_op(store, "a", "c1")
    for _ in range(200):
        if len(received) == 3:
            break
        threading.Event().wait(0.01)
    context.cancel()
    reader.join(timeout=5)
    assert [c.resync for c in received] == [True, False, False]


# -- the journal -----------------------------------------------------------------------------


def test_operations_and_request_ids_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    first = OperationStore("sim", state_path=path)
    assert first.durable
    done = _run_op(first, "done", "c1")
    failed = _run_op(first, "failed", "c2", end=FAILED)
    running, _ = first.start(request_id="running", kind=CP, cluster_id="c3", target_version="1.30")
    first.update(running.id, state=RUNNING, progress=40)
    first.close()

    second = OperationStore("sim", state_path=path)
    assert second.get(done).state == SUCCEEDED
    assert (second.get(failed).state, second.get(failed).error_code) == (FAILED, "X")
    again, created = second.start(request_id="done", kind=OUT, cluster_id="c1")
    assert (again.id, again.state, created) == (done, SUCCEEDED, False)
    recovered = second.recovered_in_flight()
    assert [(op.id, op.state, op.progress_percent) for op in recovered] == [
        (running.id, RUNNING, 40)
    ]
    # The recovered operation still holds its cluster, as it did before the restart.
    assert second.in_flight("c3") is not None
    with pytest.raises(Exception, match="in flight"):
        second.start(request_id="other", kind=OUT, cluster_id="c3")
    second.update(running.id, state=FAILED, error_code="INTERRUPTED", error_message="restart")
    second.close()
    third = OperationStore("sim", state_path=path)
    assert third.get(running.id).state == FAILED
    assert third.recovered_in_flight() == []
    third.close()


def test_a_torn_last_line_is_dropped_and_a_broken_middle_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    store = OperationStore(state_path=path)
    op_id = _run_op(store, "a", "c1")
    store.close()
    with path.open("a") as journal:
        journal.write('{"id": "half')
    reloaded = OperationStore(state_path=path)
    assert reloaded.get(op_id).state == SUCCEEDED
    reloaded.close()
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"ops.jsonl:2 is not an operation journal record"):
        OperationStore(state_path=path)


def test_a_start_the_journal_cannot_record_is_unavailable_and_kept_nowhere(
    tmp_path: Path,
) -> None:
    store = OperationStore(state_path=tmp_path / "ops.jsonl")
    kept = _run_op(store, "kept", "c1")
    journal = store._journal
    assert journal is not None
    real = journal._file
    with open("/dev/full", "a", encoding="utf-8") as full:  # every write fails: ENOSPC
        journal._file = full
        try:
            with pytest.raises(Unavailable, match="cannot write"):
                store.start(request_id="lost", kind=OUT, cluster_id="c2")
        finally:
            journal._file = real
            with contextlib.suppress(OSError):
                full.close()  # drops what the device refused
    assert store.lookup("lost") is None
    assert store.in_flight("c2") is None
    _, created = store.start(request_id="lost", kind=OUT, cluster_id="c2")
    assert created
    store.close()
    reloaded = OperationStore(state_path=tmp_path / "ops.jsonl")
    assert {op.request_id for op in reloaded.operations()} == {"kept", "lost"}
    assert reloaded.get(kept).state == SUCCEEDED
    reloaded.close()


def test_one_state_file_serves_one_process_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    holder = OperationStore(state_path=path)
    with pytest.raises(ValueError, match="in use by another process"):
        OperationStore(state_path=path)
    holder.close()
    OperationStore(state_path=path).close()


def test_the_journal_is_compacted_to_one_record_per_operation(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    store = OperationStore(state_path=path)
    for i in range(400):
        _run_op(store, f"r{i}", f"c{i % 7}")
    store.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    ops = [r for r in records if "pb" in r]
    # 1,200 changes were written; compaction kept the file near one record per operation.
    assert len(ops) < 2 * 400 + 1
    assert len({r["id"] for r in ops}) == 400
    reloaded = OperationStore(state_path=path)
    assert reloaded.lookup("r399") is not None
    reloaded.close()


def test_a_store_without_state_path_is_not_durable() -> None:
    assert not OperationStore().durable


# -- over gRPC, through the SDK servicer -------------------------------------------------------


class _StoreBackend:
    """A ClusterBackend whose watch is the store's (as every SDK plugin's is)."""

    def __init__(self, store: OperationStore) -> None:
        self.store = store

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        return self.store.watch(cluster_ids, include_in_flight, context)


class _PlainBackend:
    """A backend that streams operations without an OperationStore."""

    def __init__(self, ops: Mapping[str, int]) -> None:
        self.ops = ops

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        for op_id, state in self.ops.items():
            yield cluster_pb2.Operation(id=op_id, cluster_id="c1", state=state)  # type: ignore[arg-type]


def _serve(start_server: StartServer, backend: object) -> str:
    identity = StaticIdentity("store-test", "0.1", [identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE])
    cluster = ClusterServicer(backend)  # type: ignore[arg-type]
    return start_server(PluginServicers(identity=identity, cluster=cluster)).address


def _first(client: PluginClient, count: int, since: int) -> list[Response]:
    watch = client.watch_operation_changes(since_revision=since)
    taken: list[Response] = []
    for item in watch:
        taken.append(item)
        if len(taken) == count:
            break
    watch.cancel()
    return taken


def test_a_backend_returning_store_watch_is_resumable_over_grpc(
    start_server: StartServer,
) -> None:
    store = OperationStore()
    address = _serve(start_server, _StoreBackend(store))
    a = _run_op(store, "a", "c1")
    with PluginClient(address) as client:
        everything = _first(client, 3, since=store.revision - 3)
        assert [c.operation.id for c in everything] == [a] * 3
        assert [c.revision for c in everything] == [
            store.revision - 2,
            store.revision - 1,
            store.revision,
        ]
        b = _run_op(store, "b", "c2")
        resumed = _first(client, 3, since=everything[-1].revision)
        assert [(c.operation.id, c.resync) for c in resumed] == [(b, False)] * 3
        resynced = _first(client, 2, since=7)
        assert [c.resync for c in resynced] == [True, False]
        assert {c.operation.id for c in resynced} == {a, b}
        with pytest.raises(Exception, match="since_revision"):
            _first(client, 1, since=-1)


def test_a_backend_without_a_store_numbers_its_stream_and_resyncs(
    start_server: StartServer,
) -> None:
    address = _serve(start_server, _PlainBackend({"op-1": RUNNING, "op-2": SUCCEEDED}))
    with PluginClient(address) as client:
        fresh = _first(client, 2, since=0)
        resumed = _first(client, 2, since=fresh[-1].revision)
    assert [(c.revision, c.resync) for c in fresh] == [(1, False), (2, False)]
    assert [(c.revision, c.resync) for c in resumed] == [(1, True), (2, False)]
