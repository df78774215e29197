"""GrpcProvider's inventory over a live simulated fleet (KeptInventory): a row whose answer did
not change is the very observation of the pass before, a changed row is converted again; a
plugin that keeps revisions is asked only what changed (ListClusters changed_since), and the
inventory kept from its changes equals a whole listing after every step of a random history
(drift, availability, operations, the plugin restarted); a plugin that misses a change is
caught by the periodic whole listing."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator.adapters import provider as provider_module
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.provider import (
    GrpcProvider,
    KeptInventory,
    OperationTracker,
    PluginPool,
    cluster_from_pb,
)
from orchestrator.engine.observations import ClusterObs
from plugins.sdk.client import PluginClient
from plugins.sim import SimOptions, Simulator
from tests.support.plugin_harness import wait_until


@pytest.fixture
def sim_options() -> SimOptions:
    return SimOptions(generate=6, step_seconds=0.05, seed=1, registry=CollectorRegistry())


class _Counting:
    """The client, counting the listings asked for by what they asked."""

    def __init__(self, client: PluginClient) -> None:
        self.client, self.asked = client, []
        self.plugin_name = client.plugin_name

    def list_since(self, changed_since: str = "", page_size: int = 500) -> object:
        self.asked.append(changed_since)
        return self.client.list_since(changed_since, page_size)


def _whole(client: PluginClient) -> dict[str, ClusterObs]:
    return {c.id: cluster_from_pb(c) for c in client.list_clusters()}


def _ended(client: PluginClient, op: cluster_pb2.Operation) -> None:
    wait_until(
        lambda: (
            client.get_operation(op.id).state
            in (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)
        ),
        what=f"operation {op.id} ends",
    )


def test_unchanged_rows_are_reused_and_only_the_changes_are_asked_for(
    client: PluginClient,
) -> None:
    kept = KeptInventory()
    counting = _Counting(client)

    def inventory() -> dict[str, ClusterObs]:
        # A provider per pass, as the controller builds one per reconcile.
        tracker = OperationTracker(lambda plugin, op: None)
        provider = GrpcProvider(counting, tracker, lambda: datetime.now(UTC), kept=kept)  # type: ignore[arg-type]
        return provider.inventory()

    first = inventory()
    assert len(first) == 6 and len(kept.converted) == 6
    again = inventory()
    assert again is not first and again == first
    assert all(again[cid] is first[cid] for cid in first)  # nothing converted again
    assert counting.asked[0] == "" and counting.asked[1] == kept.revision != ""

    target = sorted(first)[0]
    op = client.service_out("req-1", target)
    _ended(client, op)
    after = inventory()
    assert after[target] is not first[target]
    assert first[target].in_service and not after[target].in_service
    assert all(after[cid] is first[cid] for cid in first if cid != target)
    assert after == _whole(client)
    assert all(counting.asked[1:]), "a whole listing where the changes would do"


def test_the_inventory_kept_from_changes_equals_a_whole_listing_after_every_step(
    sim: Simulator, client: PluginClient
) -> None:
    rng = random.Random(7)
    kept = KeptInventory()
    ids = sorted(_whole(client))
    fleet = sim.fleet
    seq = 0
    for step in range(60):
        cid = rng.choice(ids)
        what = rng.randrange(5)
        if what == 0:
            fleet.set_health(cid, available=rng.random() < 0.5)
        elif what == 1:
            fleet.set_versions(cid, control_plane_version=rng.choice(["1.28.5", "1.29.1"]))
        else:
            seq += 1
            call = client.service_out if what == 2 else client.service_in
            _ended(client, call(f"req-{seq}", cid))
        read = kept.read(client)
        assert read == _whole(client), f"step {step}: the kept inventory differs"
    assert kept.missed == 0 and kept.reads == 60


def test_a_revision_of_another_process_is_answered_whole(client: PluginClient) -> None:
    first = client.list_since()
    assert not first.changes_only and first.revision and len(first.clusters) == 6
    epoch, _, number = first.revision.partition(":")
    for other in (f"{'0' * len(epoch)}:{number}", f"{epoch}:{int(number) + 1000}", "junk"):
        answer = client.list_since(other)
        assert not answer.changes_only and len(answer.clusters) == 6
    assert client.list_since(first.revision).changes_only


def test_a_plugin_that_misses_a_change_is_caught_by_the_whole_listing(
    sim: Simulator,
    client: PluginClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics(CollectorRegistry())
    kept = KeptInventory(on_missed=PluginPool(metrics, "test").count_missed)
    kept.read(client)
    fleet = sim.fleet
    cid = sorted(_whole(client))[0]
    # The plugin's bug: a change that its answers show but its revisions do not record.
    log = fleet._revisions
    real = log.touch

    def forgetful(cluster_id: str) -> None:
        if cluster_id != cid:
            real(cluster_id)

    monkeypatch.setattr(log, "touch", forgetful)
    fleet.set_health(cid, available=False)
    stale = kept.read(client)
    assert stale[cid].available, "the missed change should be invisible to a listing of changes"
    monkeypatch.setattr(provider_module, "FULL_LIST_EVERY", 1)
    with caplog.at_level(logging.ERROR, logger=provider_module.__name__):
        fresh = kept.read(client)
    assert not fresh[cid].available and fresh == _whole(client)
    assert kept.missed == 1
    # ... and counted where an alert can see it, by the plugin's name.
    missed = metrics.registry.get_sample_value(
        "multicluster_controller_inventory_missed_changes_total",
        {"plugin": client.plugin_name},
    )
    assert missed == 1.0
    assert any(
        "missed 1 clusters" in r.getMessage() and cid in r.getMessage() for r in caplog.records
    )
