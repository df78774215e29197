"""GrpcProvider's inventory over a live simulated fleet: a row whose answer did not change is
the very observation of the pass before, a changed row is converted again, and the rows kept
between passes are this answer's only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator.adapters.provider import GrpcProvider, OperationTracker
from orchestrator.engine.observations import ClusterObs
from plugins.sdk.client import PluginClient
from plugins.sim import SimOptions, Simulator
from tests.support.plugin_harness import wait_until


@pytest.fixture
def client() -> Iterator[PluginClient]:
    sim = Simulator(SimOptions(generate=6, step_seconds=0.2, seed=1, registry=CollectorRegistry()))
    client = PluginClient(sim.address, caller="test")
    yield client
    client.close()
    sim.stop(grace=0)


def test_unchanged_rows_are_reused_and_only_the_answer_s_rows_are_kept(
    client: PluginClient,
) -> None:
    converted: dict[bytes, ClusterObs] = {}

    def inventory() -> dict[str, ClusterObs]:
        # A provider per pass, as the controller builds one per reconcile.
        tracker = OperationTracker(lambda plugin, op: None)
        return GrpcProvider(
            client, tracker, lambda: datetime.now(UTC), converted=converted
        ).inventory()

    first = inventory()
    assert len(first) == 6 and len(converted) == 6
    again = inventory()
    assert all(again[cid] is first[cid] for cid in first)  # nothing converted again

    target = sorted(first)[0]
    op = client.service_out("req-1", target)
    wait_until(
        lambda: client.get_operation(op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED,
        what="the service-out ends",
    )
    after = inventory()
    assert after[target] is not first[target]
    assert first[target].in_service and not after[target].in_service
    assert all(after[cid] is first[cid] for cid in first if cid != target)
    # The old answer's bytes of the changed row are not kept beside the new ones.
    assert len(converted) == 6
    assert sorted(obs.id for obs in converted.values()) == sorted(first)
