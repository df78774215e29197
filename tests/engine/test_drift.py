"""Invariant 7 at the control plane: someone else (a release channel) upgrades a cluster's control
plane to or past the run's target (after the run pinned its targets: before, the spec is refused
as a downgrade) while its node pools stay behind. The run preflights and
upgrades only what is still short of target, never asks the control plane to go back, records
the drift on the cluster's ClusterUpgrade and counts nothing of it as a failure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta

from orchestrator import api
from orchestrator.engine.conditions import get_condition
from orchestrator.engine.decide import CONTROL_PLANE_PAST_TARGET, Call, Preflight, Verdict
from orchestrator.engine.observations import OpKind, OpObs
from orchestrator.pipeline.simulate import T0, ModelFleet
from plugins.sdk import versions
from tests.engine.model import U, harness, make_fleet, per_pool, spec_for

OLD = "1.27.6"
TARGET = "1.28.4"
PAST = "1.28.9"


@dataclass
class ContractFleet(ModelFleet):
    """A model fleet whose preflight judges by the plugin contract's rules, as a provider does:
    a control-plane target older than the control plane is a downgrade (REFUSED_NEVER), and a
    node pool may not be newer than the control plane it is judged against (the control-plane
    target when one is asked for, else the version the control plane has). Every request is
    kept; a control-plane step that would go backwards is a test failure."""

    asked: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        self.asked.append((cluster_id, version, dict(pools)))
        at = T0 + timedelta(seconds=self.now)
        current = self.clusters[cluster_id].control_plane_version
        if version and versions.is_downgrade(current, version):
            return Preflight(
                Verdict.REFUSED_NEVER,
                at,
                "DOWNGRADE_NOT_SUPPORTED",
                f"control plane is at {current}; downgrading it to {version} is not supported",
            )
        against = version or current
        for name, target in sorted(pools.items()):
            if versions.is_newer(target, against):
                return Preflight(
                    Verdict.REFUSED_NEVER,
                    at,
                    "NODE_POOL_AHEAD_OF_CONTROL_PLANE",
                    f"node pool {name} cannot be newer than the control plane ({against})",
                )
        return Preflight(Verdict.ACCEPTED, at)

    def execute(self, action: Call, now: float) -> OpObs:
        current = self.clusters[action.cluster_id].control_plane_version
        if action.kind is OpKind.CONTROL_PLANE and versions.is_downgrade(current, action.version):
            raise AssertionError(f"control plane of {action.cluster_id} asked to go back")
        return super().execute(action, now)


def _fleet(n: int) -> ContractFleet:
    return ContractFleet(dict(make_fleet(n, version=OLD).clusters))


def _upgraded_outside(fleet: ContractFleet, cid: str, control_plane: str, pools: str) -> None:
    """Someone else moves the control plane (and the pools) of one cluster, no operation."""
    c = fleet.clusters[cid]
    fleet.clusters[cid] = replace(
        c,
        control_plane_version=control_plane,
        node_pools=tuple(replace(p, version=pools) for p in c.node_pools),
    )


def _drift(st: api.ClusterUpgradeStatus) -> api.Condition | None:
    return get_condition(st.conditions, CONTROL_PLANE_PAST_TARGET)


def test_control_plane_past_target_with_pools_behind_upgrades_only_the_pools() -> None:
    fleet = _fleet(5)
    h = harness(spec_for(fleet, TARGET, required=3), fleet)
    _upgraded_outside(fleet, "c00002", PAST, OLD)  # after pinning, before the first pass
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED, h.last and h.last.decision.message
    drifted = fleet.clusters["c00002"]
    assert drifted.control_plane_version == PAST  # left where someone else put it
    assert set(per_pool(drifted).values()) == {TARGET}
    assert drifted.in_service and drifted.available
    assert OpKind.CONTROL_PLANE not in h.steps_of("c00002")
    assert h.steps_of("c00002").count(OpKind.NODE_POOL) == 2
    # Preflighted for the pools only, judged against the control plane it has.
    asked = [(v, p) for c, v, p in fleet.asked if c == "c00002"]
    assert asked and all(
        v == "" and p == dict.fromkeys(per_pool(drifted), TARGET) for v, p in asked
    )
    st = h.by_cluster()["c00002"]
    assert st.phase == U.UPGRADED and PAST in (st.message or "")
    cond = _drift(st)
    assert cond is not None and cond.status == "True" and cond.reason == "UpgradedOutsideRun"
    assert PAST in cond.message and TARGET in cond.message
    # Nothing of it is a failure; the others went the whole way; the floor held.
    assert h.last is not None
    assert h.last.decision.counts == api.RunCounts(total=5, upgraded=5)
    assert h.last.decision.failures is None
    for cid in ("c00000", "c00001", "c00003", "c00004"):
        assert fleet.clusters[cid].control_plane_version == TARGET
        assert _drift(h.by_cluster()[cid]) is None
    assert fleet.min_available_in_service >= 3


def test_control_plane_pushed_past_target_mid_run_does_not_halt_it() -> None:
    """The drift comes while the run is under way, to a cluster still waiting its turn."""
    fleet = _fleet(4)
    h = harness(spec_for(fleet, TARGET, required=3), fleet)

    def first_done(x: object) -> bool:
        return h.phases()["c00000"] == U.UPGRADED

    assert h.run(until=first_done)
    assert h.phases()["c00003"] == U.PENDING
    _upgraded_outside(fleet, "c00003", PAST, OLD)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED, h.last and h.last.decision.message
    c3 = fleet.clusters["c00003"]
    assert c3.control_plane_version == PAST
    assert set(per_pool(c3).values()) == {TARGET}
    assert OpKind.CONTROL_PLANE not in h.steps_of("c00003")
    assert _drift(h.by_cluster()["c00003"]) is not None
    assert h.last is not None and h.last.decision.failures is None
    assert fleet.min_available_in_service >= 3


def test_control_plane_exactly_at_target_is_done_and_not_drift() -> None:
    fleet = _fleet(3)
    h = harness(spec_for(fleet, TARGET, required=2), fleet)
    # A provider build of the target release counts as the target (no drift either).
    _upgraded_outside(fleet, "c00001", f"{TARGET}-gke.200", OLD)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    c1 = fleet.clusters["c00001"]
    assert c1.control_plane_version == f"{TARGET}-gke.200"
    assert set(per_pool(c1).values()) == {TARGET}
    assert h.steps_of("c00001") == [
        OpKind.SERVICE_OUT,
        OpKind.NODE_POOL,
        OpKind.NODE_POOL,
        OpKind.SERVICE_IN,
    ]
    assert {v for c, v, _ in fleet.asked if c == "c00001"} == {""}  # pools only
    st = h.by_cluster()["c00001"]
    assert st.phase == U.UPGRADED and _drift(st) is None
    assert h.last is not None and h.last.decision.failures is None


def test_control_plane_and_pools_past_target_is_skipped_untouched() -> None:
    fleet = _fleet(3)
    h = harness(spec_for(fleet, TARGET, required=2), fleet)
    _upgraded_outside(fleet, "c00000", PAST, PAST)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    c0 = fleet.clusters["c00000"]
    assert c0.control_plane_version == PAST and set(per_pool(c0).values()) == {PAST}
    assert h.steps_of("c00000") == []
    assert all(c != "c00000" for c, _, _ in fleet.asked)
    st = h.by_cluster()["c00000"]
    assert st.phase == U.SKIPPED and st.reason == "AtTarget"
    assert _drift(st) is not None
    assert h.last is not None
    assert h.last.decision.counts == api.RunCounts(total=3, upgraded=2, skipped=1)
    assert h.last.decision.failures is None


def test_control_plane_pushed_past_target_while_going_out_gets_no_control_plane_step() -> None:
    """The drift comes while the run takes the cluster out: the run goes on from what is left."""
    fleet = _fleet(3)
    h = harness(spec_for(fleet, TARGET, required=2, maxConcurrency=1), fleet)
    assert h.run(until=lambda x: h.phases()["c00000"] == U.SERVICING_OUT)
    _upgraded_outside(fleet, "c00000", PAST, OLD)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED, h.last and h.last.decision.message
    c0 = fleet.clusters["c00000"]
    assert c0.control_plane_version == PAST and set(per_pool(c0).values()) == {TARGET}
    assert c0.in_service
    assert h.steps_of("c00000") == [
        OpKind.SERVICE_OUT,
        OpKind.NODE_POOL,
        OpKind.NODE_POOL,
        OpKind.SERVICE_IN,
    ]
    st = h.by_cluster()["c00000"]
    assert st.phase == U.UPGRADED and _drift(st) is not None
    assert h.last is not None and h.last.decision.failures is None
    assert fleet.min_available_in_service >= 2
