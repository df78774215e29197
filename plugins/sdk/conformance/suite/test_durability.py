"""Conformance of PLUGIN_CAPABILITY_DURABLE_OPERATIONS: operations and request ids survive a
restart of the plugin (with a restart hook), and are found again by request id."""

from __future__ import annotations

import time

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.conformance.suite._kit import Mutation, new_request_id, wait_terminal
from plugins.sdk.conformance.target import NOTES_KEY, ConformanceTarget


@pytest.fixture(autouse=True)
def _needs_durability(capabilities: frozenset[int]) -> None:
    if identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS not in capabilities:
        pytest.skip("DURABLE_OPERATIONS is not among the declared capabilities")


def _wait_ready(client: PluginClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            probe = client.probe()
        except PluginCallError as exc:
            last = str(exc)
        else:
            if probe.ready:
                return
            last = f"not ready: {probe.message}"
        time.sleep(0.2)
    pytest.fail(f"the plugin did not come back within {timeout:g} s after the restart ({last})")


def test_operations_and_request_ids_survive_a_restart(
    client: PluginClient,
    mutation: Mutation,
    target: ConformanceTarget,
    request: pytest.FixtureRequest,
) -> None:
    request_id = new_request_id()
    started = mutation.start(request_id)
    before = wait_terminal(client, started.id, target.timeout)
    if target.restart is None:
        request.config.stash.setdefault(NOTES_KEY, []).append(
            "DURABLE_OPERATIONS is declared but no restart hook was given (--restart-command): "
            "only request-id idempotency was checked, not survival of a restart"
        )
    else:
        target.restart()
        _wait_ready(client, target.timeout)
    after = client.get_operation(started.id)
    assert after.state == before.state, (
        f"operation {started.id} was {cluster_pb2.OperationState.Name(before.state)}, "
        f"now {cluster_pb2.OperationState.Name(after.state)}"
    )
    assert (after.request_id, after.kind, after.cluster_id) == (
        request_id,
        before.kind,
        before.cluster_id,
    ), f"operation {started.id} changed identity"
    again = mutation.start(request_id)
    assert again.id == started.id, (
        f"{mutation.rpc} with request_id {request_id} started {again.id}; it started "
        f"{started.id} before" + (" the restart" if target.restart else "")
    )
    assert again.state == before.state
