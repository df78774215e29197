"""Conformance of resumable WatchOperations: revisions increase, a resumed stream replays what
followed its since_revision, and a revision the plugin cannot replay from says resync."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginClient
from plugins.sdk.conformance.suite._kit import (
    TERMINAL,
    ChangeRecorder,
    Mutation,
    new_request_id,
    require_rpc,
)
from plugins.sdk.conformance.target import ConformanceTarget

Response = cluster_pb2.WatchOperationsResponse
_FUTURE = 10**9  # added to the last revision seen: a revision the plugin never gave out


@pytest.fixture(autouse=True)
def _needs_watch(capabilities: frozenset[int]) -> None:
    require_rpc(capabilities, "WatchOperations")


def _terminal_of(op_id: str) -> Callable[[Response], bool]:
    """Matches a response carrying op_id in a terminal state."""
    return lambda r: r.operation.id == op_id and r.operation.state in TERMINAL


@pytest.fixture
def history(
    client: PluginClient, cluster_id: str, mutation: Mutation, target: ConformanceTarget
) -> tuple[list[Response], cluster_pb2.Operation, cluster_pb2.Operation]:
    """Two operations on the test cluster, one after the other, as one stream delivered them:
    (every response, the first operation, the second)."""
    recorder = ChangeRecorder(client, [cluster_id])
    try:
        first = mutation.start(new_request_id())
        recorder.wait_for(_terminal_of(first.id), target.timeout, f"the end of {first.id}")
        second_call = mutation.undo or mutation.start
        second = second_call(new_request_id())
        recorder.wait_for(_terminal_of(second.id), target.timeout, f"the end of {second.id}")
    finally:
        recorder.close()
    return recorder.updates, first, second


def test_every_response_carries_a_strictly_increasing_revision(
    history: tuple[list[Response], cluster_pb2.Operation, cluster_pb2.Operation],
) -> None:
    responses, _, _ = history
    revisions = [r.revision for r in responses]
    assert all(r > 0 for r in revisions), f"a response without a revision: {revisions}"
    assert revisions == sorted(set(revisions)), (
        f"revisions of one stream must strictly increase: {revisions}"
    )
    assert not any(r.resync for r in responses), "resync on a stream that asked for none"


def test_a_resumed_watch_replays_the_changes_after_its_revision(
    client: PluginClient,
    cluster_id: str,
    target: ConformanceTarget,
    history: tuple[list[Response], cluster_pb2.Operation, cluster_pb2.Operation],
) -> None:
    responses, first, second = history
    since = next(r.revision for r in responses if _terminal_of(first.id)(r))
    missed = [r.revision for r in responses if r.revision > since]
    resumed = ChangeRecorder(client, [cluster_id], since_revision=since)
    try:
        resumed.wait_for(
            _terminal_of(second.id), target.timeout, f"the replayed end of {second.id}"
        )
    finally:
        resumed.close()
    got = [r.revision for r in resumed.updates]
    assert not any(r.resync for r in resumed.updates), (
        f"since_revision={since} is seconds old, yet the plugin answered resync; it must "
        "retain recent changes and replay them"
    )
    assert all(r > since for r in got), f"replayed revisions {got} include some <= {since}"
    assert set(missed) <= set(got), (
        f"changes {sorted(set(missed) - set(got))} after since_revision={since} not replayed"
    )


@pytest.mark.parametrize("where", ["ancient", "future"])
def test_a_revision_that_cannot_be_replayed_answers_resync(
    client: PluginClient,
    cluster_id: str,
    target: ConformanceTarget,
    history: tuple[list[Response], cluster_pb2.Operation, cluster_pb2.Operation],
    where: str,
) -> None:
    responses, _, second = history
    since = 1 if where == "ancient" else responses[-1].revision + _FUTURE
    resumed = ChangeRecorder(client, [cluster_id], since_revision=since)
    try:
        first_response = resumed.wait_for(lambda _r: True, target.timeout, "a first response")
        if not first_response.resync:
            pytest.fail(
                f"since_revision={since} was never given out (or is long gone), yet the first "
                f"response (revision {first_response.revision}) has resync=false"
            )
        resumed.wait_for(
            lambda r: r.operation.id == second.id,
            target.timeout,
            f"the current state of {second.id} in the resync",
        )
    finally:
        resumed.close()
