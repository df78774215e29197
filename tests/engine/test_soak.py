"""Invariant 4 with a provider's own waits: a node pool whose upgrade soaks by the provider's
settings (GKE blue-green: batch and node-pool soaks, reported as `upgrade_soak_seconds`) gets
that soak on top of `timeouts.nodePool`, so a healthy blue-green upgrade is not failed as hung,
and a hung one is still failed, naming both parts of its bound."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.engine.observations import OpKind
from orchestrator.pipeline.simulate import ModelFleet
from tests.engine.model import U, harness, make_fleet, spec_for

OLD, NEW = "1.28.5", "1.29.1"
HOUR = 3600.0


def _blue_green(work: float) -> tuple[ModelFleet, str]:
    """Two clusters (floor 1) whose pools soak an hour by the provider's settings;
    node-pool operations take `work` seconds. Returns the fleet and its first cluster."""
    fleet = make_fleet(2, version=OLD)
    for cid, c in list(fleet.clusters.items()):
        pools = tuple(replace(p, soak_seconds=int(HOUR)) for p in c.node_pools)
        fleet.clusters[cid] = replace(c, node_pools=pools)
    fleet.durations = {**fleet.durations, OpKind.NODE_POOL: work}
    return fleet, min(fleet.clusters)


def test_a_blue_green_soak_extends_the_node_pool_bound() -> None:
    # 90 minutes of upgrade: past timeouts.nodePool (1h), within 1h + the 1h soak.
    fleet, cid = _blue_green(work=1.5 * HOUR)
    h = harness(spec_for(fleet, NEW, 1, _timeouts={"nodePool": "1h"}), fleet)
    assert h.run()
    status = h.by_cluster()[cid]
    assert status.phase is U.UPGRADED, status.message
    assert {p.version for p in fleet.clusters[cid].node_pools} == {NEW}


def test_a_blue_green_upgrade_past_work_and_soak_still_fails_as_hung() -> None:
    fleet, cid = _blue_green(work=2.5 * HOUR)
    h = harness(spec_for(fleet, NEW, 1, _timeouts={"nodePool": "1h"}), fleet)
    h.run()
    status = h.by_cluster()[cid]
    assert status.phase is U.FAILED and status.reason == "StepTimedOut", status
    assert "2:00:00 (1:00:00 + 1:00:00 of the provider's own soak)" in (status.message or "")


def test_a_surge_pool_keeps_the_plain_bound() -> None:
    fleet = make_fleet(2, version=OLD)
    cid = min(fleet.clusters)
    fleet.durations = {**fleet.durations, OpKind.NODE_POOL: 1.5 * HOUR}
    h = harness(spec_for(fleet, NEW, 1, _timeouts={"nodePool": "1h"}), fleet)
    h.run()
    status = h.by_cluster()[cid]
    assert status.phase is U.FAILED and status.reason == "StepTimedOut", status
    assert (status.message or "").endswith("within 1:00:00")
