"""Helpers the conformance checks share: expected errors, waiting, watching, safe mutations."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError, PluginClient, supports

__all__ = [
    "TERMINAL",
    "UNKNOWN_ID",
    "WATCH_SETTLE_SECONDS",
    "ChangeRecorder",
    "Mutation",
    "OperationRecorder",
    "choose_mutation",
    "expect_error",
    "new_request_id",
    "require_rpc",
    "wait_terminal",
]

Cap = identity_pb2.PluginCapability
TERMINAL = frozenset({cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED})
IN_FLIGHT = frozenset({cluster_pb2.OPERATION_STATE_PENDING, cluster_pb2.OPERATION_STATE_RUNNING})
UNKNOWN_ID = "conformance-no-such-id-7f3a9c"
"""An id no plugin has: used for NOT_FOUND checks."""

WATCH_SETTLE_SECONDS = 0.5
"""Time given to the plugin to register a new WatchOperations stream before the kit mutates.

The contract has no acknowledgement that a watch is registered; this is a settling delay,
never an assertion.
"""


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Cancellable(Protocol[T_co]):
    def __iter__(self) -> Iterator[T_co]: ...

    def cancel(self) -> None: ...


def new_request_id() -> str:
    """A request_id no one has used before."""
    return f"conformance-{uuid.uuid4().hex[:20]}"


def require_rpc(capabilities: frozenset[int], rpc: str) -> None:
    """Skips the check when rpc is outside the declared capabilities."""
    if not supports(capabilities, rpc):
        pytest.skip(f"{rpc} is outside the declared capabilities")


def expect_error(
    code: grpc.StatusCode, call: Callable[[], object], what: str, *, names: str = ""
) -> PluginCallError:
    """Runs call and checks that it fails with code (and that the message names `names`)."""
    try:
        result = call()
    except PluginCallError as exc:
        assert exc.code is code, (
            f"{what}: expected {code.name}, got {exc.code.name} ({exc.message!r})"
        )
        if names:
            assert names in exc.message, (
                f"{what}: the {code.name} message {exc.message!r} does not name the field {names!r}"
            )
        return exc
    text = str(result).replace("\n", " ")[:200]
    pytest.fail(f"{what}: expected {code.name}, but the call succeeded ({text})")


def wait_terminal(client: PluginClient, op_id: str, timeout: float) -> cluster_pb2.Operation:
    """Polls GetOperation until the operation is SUCCEEDED or FAILED; fails after timeout."""
    deadline = time.monotonic() + timeout
    interval = 0.05
    while True:
        op = client.get_operation(op_id)
        if op.state in TERMINAL:
            return op
        if time.monotonic() >= deadline:
            pytest.fail(
                f"operation {op_id} still {cluster_pb2.OperationState.Name(op.state)} after "
                f"{timeout:g} s (raise --timeout if the plugin is slow)"
            )
        time.sleep(interval)
        interval = min(interval * 2, 0.5)


class _Recorder(Generic[T]):
    """Reads a stream in a thread and keeps every item it delivers."""

    def __init__(self, watch: _Cancellable[T], settle: bool = True) -> None:
        self._watch = watch
        self._queue: queue.Queue[T | BaseException] = queue.Queue()
        self.updates: list[T] = []
        self._thread = threading.Thread(target=self._read, name="conformance-watch", daemon=True)
        self._thread.start()
        if settle:
            time.sleep(WATCH_SETTLE_SECONDS)

    def _read(self) -> None:
        try:
            for item in self._watch:
                self._queue.put(item)
        except PluginCallError as exc:
            self._queue.put(exc)

    def wait_for(self, predicate: Callable[[T], bool], timeout: float, what: str) -> T:
        """The first delivered item matching predicate; fails when none comes in time."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"WatchOperations did not deliver {what} within {timeout:g} s")
            try:
                item = self._queue.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                pytest.fail(f"WatchOperations failed while waiting for {what}: {item}")
            self.updates.append(item)
            if predicate(item):
                return item

    def collect(self, seconds: float) -> list[T]:
        """Every item delivered within the next seconds (kept in updates too)."""
        deadline = time.monotonic() + seconds
        got: list[T] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if isinstance(item, BaseException):
                pytest.fail(f"WatchOperations failed: {item}")
            self.updates.append(item)
            got.append(item)
        return got

    def close(self) -> None:
        """Cancels the stream."""
        self._watch.cancel()
        self._thread.join(timeout=5)


class OperationRecorder(_Recorder[cluster_pb2.Operation]):
    """Reads a WatchOperations stream in a thread and keeps every operation it delivers."""

    def __init__(self, client: PluginClient, cluster_ids: list[str]) -> None:
        super().__init__(client.watch_operations(cluster_ids, include_in_flight=True))


class ChangeRecorder(_Recorder[cluster_pb2.WatchOperationsResponse]):
    """Reads a WatchOperations stream (responses with revision and resync) in a thread."""

    def __init__(
        self, client: PluginClient, cluster_ids: list[str], since_revision: int = 0
    ) -> None:
        watch = client.watch_operation_changes(
            cluster_ids, since_revision=since_revision, include_in_flight=True
        )
        super().__init__(watch, settle=since_revision == 0)


@dataclass(frozen=True)
class Mutation:
    """A change the kit may make to a cluster without harming it, and how to undo it."""

    rpc: str
    kind: int
    start: Callable[[str], cluster_pb2.Operation]  # request_id -> operation
    undo: Callable[[str], cluster_pb2.Operation] | None  # request_id -> operation
    immediate: bool  # nothing to do: the contract says it is SUCCEEDED at once


def choose_mutation(
    client: PluginClient, capabilities: frozenset[int], cluster: cluster_pb2.Cluster
) -> Mutation | None:
    """The harmless mutation to test with, preferring one that does real work."""
    cid = cluster.id
    if Cap.PLUGIN_CAPABILITY_CLUSTER_SERVICE in capabilities:
        if cluster.in_service:
            return Mutation(
                rpc="ServiceOut",
                kind=cluster_pb2.OPERATION_KIND_SERVICE_OUT,
                start=lambda rid: client.service_out(rid, cid),
                undo=lambda rid: client.service_in(rid, cid),
                immediate=False,
            )
        return Mutation(
            rpc="ServiceOut",
            kind=cluster_pb2.OPERATION_KIND_SERVICE_OUT,
            start=lambda rid: client.service_out(rid, cid),
            undo=None,
            immediate=True,
        )
    if Cap.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE in capabilities:
        version = cluster.control_plane_version
        return Mutation(
            rpc="UpgradeControlPlane",
            kind=cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
            start=lambda rid: client.upgrade_control_plane(rid, cid, version),
            undo=None,
            immediate=True,
        )
    if Cap.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL in capabilities and cluster.node_pools:
        pool = cluster.node_pools[0]
        return Mutation(
            rpc="UpgradeNodePool",
            kind=cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL,
            start=lambda rid: client.upgrade_node_pool(rid, cid, pool.name, pool.version),
            undo=None,
            immediate=True,
        )
    return None
