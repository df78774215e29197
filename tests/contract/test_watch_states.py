"""WatchOperations state_changes_only and ends_only (the SDK's ClusterServicer): with the
first, updates of progress alone are left out, every change of state is sent; with the second,
only an operation's end is sent live, while the in-flight operations a stream starts with are
sent whatever their state; without either, every update is."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginClient
from plugins.sdk.operations import OperationStore
from plugins.sim import SimOptions, Simulator
from tests.support.plugin_harness import wait_until

_S = cluster_pb2.OperationState


@pytest.fixture
def sim_options() -> SimOptions:
    return SimOptions(generate=2, step_seconds=0.3, seed=3, registry=CollectorRegistry())


#: The watches compared, each on the same operation: every update, states, ends.
_FLAGS = {
    "every": {},
    "states": {"state_changes_only": True},
    "ends": {"state_changes_only": True, "ends_only": True},
}


def _updates(
    client: PluginClient, store: OperationStore, request_id: str
) -> dict[str, list[tuple[int, int]]]:
    """(state, progress) of each update of one service-out, as each watch of `_FLAGS`,
    opened on its cluster before it started, delivered them: the same operation's updates,
    so the streams differ only by what their flags leave out."""
    cid = sorted(c.id for c in client.list_clusters())[0]
    watches = {
        name: client.watch_operations([cid], include_in_flight=False, **flags)
        for name, flags in _FLAGS.items()
    }
    try:
        # Every watch registered before the operation starts, so that none misses its first
        # update (before, the streams of two operations were compared, and a watch registered
        # late missed a PENDING: a flake under load).
        wait_until(lambda: store.watching >= len(watches), timeout=10)
        op = client.service_out(request_id, cid)
        out: dict[str, list[tuple[int, int]]] = {}
        for name, watch in watches.items():
            seen = out[name] = []
            for pb in watch:
                if pb.id != op.id:
                    continue
                seen.append((pb.state, pb.progress_percent))
                if pb.state in (_S.OPERATION_STATE_SUCCEEDED, _S.OPERATION_STATE_FAILED):
                    break
            else:
                raise AssertionError(f"the {name} watch ended before the operation did")
        return out
    finally:
        for watch in watches.values():
            watch.cancel()


def test_progress_alone_is_left_out_and_every_state_is_sent(
    sim: Simulator, client: PluginClient
) -> None:
    updates = _updates(client, sim.fleet.operations, "out-1")
    every, states = updates["every"], updates["states"]
    assert every[-1][0] == _S.OPERATION_STATE_SUCCEEDED
    running = [p for s, p in every if s == _S.OPERATION_STATE_RUNNING]
    assert len(running) >= 2, f"the sim sent no progress-only update to leave out: {every}"
    # Each change of state, as first sent, and nothing else.
    assert states == [u for i, u in enumerate(every) if i == 0 or u[0] != every[i - 1][0]]
    assert len(states) < len(every)


def test_ends_only_sends_one_message_per_operation_its_end(
    sim: Simulator, client: PluginClient
) -> None:
    updates = _updates(client, sim.fleet.operations, "out-2")
    assert len(updates["states"]) >= 2, f"the sim sent no state before the end: {updates}"
    assert updates["ends"] == [updates["every"][-1]]
    assert updates["ends"][0][0] == _S.OPERATION_STATE_SUCCEEDED


def test_ends_only_still_starts_with_the_operations_in_flight(
    sim: Simulator, client: PluginClient
) -> None:
    """A stream that starts with include_in_flight sends the running ones (a reconnecting
    caller learns what is in flight from them), then only ends."""
    store = sim.fleet.operations
    for attempt, cid in enumerate(sorted(c.id for c in client.list_clusters())):
        op = client.service_out(f"out-{attempt}", cid)
        watch = client.watch_operations([cid], include_in_flight=True, ends_only=True)
        try:
            wait_until(lambda: store.watching >= 1, timeout=10)
            if client.get_operation(op.id).state == _S.OPERATION_STATE_SUCCEEDED:
                continue  # it ended before the stream began (a slow machine): the next one
            # In flight when the stream registered (and took its in-flight start at once).
            seen = []
            for pb in watch:
                if pb.id == op.id:
                    seen.append(pb.state)
                    if pb.state == _S.OPERATION_STATE_SUCCEEDED:
                        break
        finally:
            watch.cancel()
        assert seen[0] in (_S.OPERATION_STATE_PENDING, _S.OPERATION_STATE_RUNNING), seen
        assert seen[1:] == [_S.OPERATION_STATE_SUCCEEDED], seen
        return
    raise AssertionError("every service-out ended before its stream began")
