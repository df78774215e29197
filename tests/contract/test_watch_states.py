"""WatchOperations state_changes_only (the SDK's ClusterServicer): updates of progress alone
are left out, every change of state is sent; without it, every update is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginClient
from plugins.sim import SimOptions, Simulator

_S = cluster_pb2.OperationState


@pytest.fixture
def client() -> Iterator[PluginClient]:
    sim = Simulator(SimOptions(generate=2, step_seconds=0.3, seed=3, registry=CollectorRegistry()))
    client = PluginClient(sim.address, caller="test")
    yield client
    client.close()
    sim.stop(grace=0)


def _updates(client: PluginClient, states_only: bool, request_id: str) -> list[tuple[int, int]]:
    """(state, progress) of each update of one service-out, as the watch delivered them."""
    cid = sorted(c.id for c in client.list_clusters())[0]
    watch = client.watch_operations([cid], include_in_flight=False, state_changes_only=states_only)
    try:
        op = (
            client.service_out(request_id, cid)
            if states_only
            else client.service_in(request_id, cid)
        )
        seen: list[tuple[int, int]] = []
        for pb in watch:
            if pb.id != op.id:
                continue
            seen.append((pb.state, pb.progress_percent))
            if pb.state in (_S.OPERATION_STATE_SUCCEEDED, _S.OPERATION_STATE_FAILED):
                return seen
    finally:
        watch.cancel()
    raise AssertionError("the watch ended before the operation did")


def test_progress_alone_is_left_out_and_every_state_is_sent(client: PluginClient) -> None:
    states_only = _updates(client, True, "out-1")
    every = _updates(client, False, "in-1")
    assert every[-1][0] == _S.OPERATION_STATE_SUCCEEDED
    running = [p for s, p in every if s == _S.OPERATION_STATE_RUNNING]
    assert len(running) >= 2, f"the sim sent no progress-only update to leave out: {every}"
    assert [s for s, _ in states_only] == [
        s for i, (s, _) in enumerate(every) if i == 0 or s != every[i - 1][0]
    ]
    assert len(states_only) < len(every)
