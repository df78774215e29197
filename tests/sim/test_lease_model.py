"""The simulation's Lease runs the product's elector belief (orchestrator.pipeline.lease) on
per-replica clocks: wall skew never moves the Lease, silence does, and a replica stalled mid-pass
past its renew deadline issues nothing more (invariant 8, checked by the monitor at every call)."""

from __future__ import annotations

import pytest

from orchestrator import api
from tests.sim.model import LEASE_TIMING, Lease
from tests.sim.world import ENDPOINT, Config, World


def _lease(skew: float) -> tuple[Lease, list[str]]:
    lease = Lease(7, ["r0", "r1"])
    lease.electors["r1"].clock.skew = skew
    lost: list[str] = []

    def on_lost(name: str) -> None:  # the process exits and is restarted
        lost.append(name)
        lease.electors[name].restart()

    lease.on_lost = on_lost
    return lease, lost


def _step(lease: Lease, until: float) -> list[tuple[float, str]]:
    """Advance in 0.25 s steps; at every step at most one replica believes it holds the
    Lease and that one is the record's holder (Lease.held raises otherwise)."""
    seen: list[tuple[float, str]] = []
    t = lease.now
    while t < until:
        t += 0.25
        lease.advance(t)
        holding = [name for name in lease.electors if lease.held(name)]
        who = holding[0] if holding else ""
        if not seen or seen[-1][1] != who:
            seen.append((t, who))
    return seen


@pytest.mark.parametrize("skew", [8.0, 20.0, -20.0])
def test_skew_never_moves_the_lease_and_silence_does(skew: float) -> None:
    lease, lost = _lease(skew)
    assert _step(lease, 600.0) == [(0.25, "r0")]
    assert lease.holder == "r0" and lease.record is not None and lease.record.transitions == 0
    lease.cut_off("r0", 60.0)  # r0's renewals stop reaching the apiserver at t=600
    seen = _step(lease, 700.0)
    assert [who for _, who in seen] == ["r0", "", "r1"], seen
    (_, _), (r0_stopped, _), (r1_took, _) = seen
    rate = lease.electors["r1"].clock.rate
    assert r0_stopped <= 600.0 + LEASE_TIMING.renew_deadline / lease.electors["r0"].clock.rate
    assert r1_took >= 598.0 + LEASE_TIMING.lease_seconds / rate
    assert lease.holder == "r1" and lease.record is not None and lease.record.transitions == 1
    assert lost == ["r0"], "r0 came back and did not see it had lost the Lease"


def test_a_replica_stalled_mid_pass_is_fenced_and_restarted() -> None:
    cfg = Config(
        seed=3,
        clusters=12,
        pools_max=1,
        owners=0,
        replicas=2,
        profile="none",
        active_seconds=0,
        health=False,
    )
    world = World(cfg)
    world.lease.electors["r0"].clock.skew = -20.0
    world.lease.electors["r1"].clock.skew = 20.0
    for c in world.fleet.clusters.values():
        c.cp = "1.28.7"
        for p in c.pools.values():
            p.version = "1.28.7"
    ids = sorted(world.fleet.clusters)
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 10,
            "opsEndpoint": {"endpoint": ENDPOINT, "insecure": True},
            "clusters": [{"id": cid, "version": "1.29.3"} for cid in ids],
            "strategy": {"maxConcurrency": 2},
        }
    )
    world.add_cluster_version("ns-a", "fleet", spec)
    # r0 leads; in its first pass after t=60 it stalls for 40 s after two fence checks, long
    # enough for r1 to see the Lease unchanged for 15 s and take it.
    world.at(60, lambda w: w.lease.arm_stall("r0", 2, 40.0), "r0 will stall mid-pass")
    world.run()  # the monitor raises Violation on any call r0 makes without the Lease
    assert "lease → r1" in " ".join(world.history)
    assert any("r0 lost the lease: restarted" in line for line in world.history)
    assert world.lease.holder == "r1"
    assert min(world.monitor.min_up.values()) >= 10
    assert all(c.cp == "1.29.3" and c.in_service for c in world.fleet.clusters.values())
    assert {r.status.phase for r in world.api.runs.values()} == {api.RunPhase.SUCCEEDED}
