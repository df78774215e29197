"""One home for "may this cluster be taken out of service" (invariants 1, 2 and 5).

Every site that issues a service-out (admission, the drain after a preUpgrade hook, the re-issue
of a service-out whose call did not take effect) asks the same predicate, in one order: owner →
another operation → out of service → floor → preflight. Each test sets up the world so that
exactly one check refuses (or several, to pin the order), decides once at each site, and
asserts what the decision leaves: no service-out of the cluster, and the wait or refusal on its
ClusterUpgrade. A clean world is the control: there each site does take the cluster out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from orchestrator import api
from orchestrator.engine.decide import (
    PRE_HOOK,
    Decision,
    Floor,
    Preflight,
    Verdict,
    hook_id,
    request_id,
)
from orchestrator.engine.observations import OpKind, OpObs, OpState
from orchestrator.pipeline.simulate import T0, ModelFleet
from tests.engine.model import U, decide_once, make_fleet, spec_for, status_after

NEW = "1.29.1"
UID = "uid-1"
CID = "c00000"
#: When each decision is made: the verdicts stamped at T0 are fresh (PREFLIGHT_TTL is 60 s).
AT = 5.0
RID = request_id(UID, CID, OpKind.SERVICE_OUT.value, NEW, 0)


@dataclass(frozen=True)
class Site:
    """Where a service-out is decided: the spec extras and c00000's status before the pass."""

    name: str
    status: api.ClusterUpgradeStatus | None
    hooks: bool = False


ADMISSION = Site("admission", None)
AFTER_HOOK = Site(
    "after the preUpgrade hook",
    api.ClusterUpgradeStatus(
        phase=U.PRE_HOOK,
        step=PRE_HOOK,
        step_start_time="2026-01-01T00:00:00Z",
        hook=api.HookStatus(
            kind=PRE_HOOK,
            id=hook_id(UID, CID, PRE_HOOK, 0),
            phase=api.HookPhase.SUCCEEDED,
            start_time="2026-01-01T00:00:00Z",
        ),
    ),
    hooks=True,
)
REISSUE = Site(
    "re-issue",
    api.ClusterUpgradeStatus(
        phase=U.SERVICING_OUT,
        step=OpKind.SERVICE_OUT.value,
        request_id=RID,
        step_start_time="2026-01-01T00:00:00Z",
    ),
)
SITES = [ADMISSION, AFTER_HOOK, REISSUE]


def _accepted(fleet: ModelFleet) -> dict[str, Preflight]:
    return {cid: Preflight(Verdict.ACCEPTED, T0) for cid in fleet.clusters}


def _decide(
    site: Site,
    fleet: ModelFleet,
    required: int = 1,
    preflight: dict[str, Preflight] | None = None,
    **kw: Any,
) -> tuple[Decision, api.ClusterUpgradeStatus]:
    """One pass with c00000 at the site; every cluster's verdict ACCEPTED unless given."""
    extra: dict[str, Any] = {"hooks": {"preUpgrade": {"http": {"url": "http://127.0.0.1:9/h"}}}}
    spec = spec_for(fleet, NEW, required=required, **(extra if site.hooks else {}))
    d, by_id = decide_once(
        fleet,
        spec,
        {CID: site.status} if site.status is not None else {},
        AT,
        preflight_supported=True,
        preflight=_accepted(fleet) if preflight is None else preflight,
        **kw,
    )
    return d, status_after(d, by_id, CID)


def _outs(d: Decision) -> list[str]:
    """The request ids of the service-outs of c00000 this pass asks for."""
    return [c.request_id for c in d.calls if c.kind is OpKind.SERVICE_OUT and c.cluster_id == CID]


def _taken(d: Decision, st: api.ClusterUpgradeStatus) -> bool:
    """Whether the pass takes c00000 out: its service-out asked for, with its intent."""
    return _outs(d) == [RID] and st.phase == U.SERVICING_OUT


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_a_clean_world_takes_the_cluster_out_at_every_site(site: Site) -> None:
    """The control: nothing refuses, and each site asks for the service-out."""
    d, st = _decide(site, make_fleet(4))
    assert _taken(d, st), (d.calls, st)
    assert CID not in d.preflight_needed


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_a_cluster_another_run_holds_is_never_taken_out(site: Site) -> None:
    """Only the owner check refuses: the cluster waits naming the holder, and neither the floor
    nor the provider is asked about it."""
    d, st = _decide(site, make_fleet(4), held_by={CID: "other/run-a"})
    assert _outs(d) == []
    assert st.phase == U.PENDING and st.reason == "HeldByAnotherRun", st
    assert "other/run-a" in (st.message or "")
    assert CID not in d.preflight_needed


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
@pytest.mark.parametrize("caller", ["someone-else:1", f"{UID}:{CID}:recover:{NEW}:0"])
def test_a_cluster_with_an_operation_in_flight_is_never_taken_out(site: Site, caller: str) -> None:
    """Only the operation check refuses: another caller's operation, or one of this run's own
    earlier steps still in flight (a second operation would collide with it)."""
    fleet = make_fleet(4)
    cur = OpObs("op-x", OpKind.CONTROL_PLANE, CID, OpState.RUNNING, caller)
    fleet.clusters[CID] = replace(fleet.clusters[CID], current_operation=cur)
    d, st = _decide(site, fleet)
    assert _outs(d) == []
    assert st.phase == U.PENDING and st.reason == "ForeignOperation", st
    assert "op-x" in (st.message or "")


@pytest.mark.parametrize("site", [ADMISSION, AFTER_HOOK], ids=lambda s: s.name)
def test_a_cluster_out_of_service_outside_the_run_is_never_taken_out(site: Site) -> None:
    """Only the out-of-service check refuses (a re-issue never meets one: a service-out whose
    cluster is out of service has taken effect, and the run goes on from there)."""
    fleet = make_fleet(4)
    fleet.clusters[CID] = replace(fleet.clusters[CID], in_service=False)
    d, st = _decide(site, fleet)
    assert _outs(d) == []
    assert st.phase == U.PENDING and st.reason == "OutOfService", st


def _floor_waits(site: Site, d: Decision, st: api.ClusterUpgradeStatus) -> bool:
    """Admission records a floor wait on the run (no write per waiting cluster); a later
    service-out records it on the cluster, which is in service and no longer held."""
    if site is ADMISSION:
        return st.phase == U.PENDING and d.waiting_reason == "AvailabilityBudget"
    return st.phase == U.PENDING and st.reason == "WaitingForBudget"


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_the_runs_own_floor_holds_at_every_site(site: Site) -> None:
    """Only this run's floor refuses: two of four are unavailable and two must stay up."""
    fleet = make_fleet(4)
    for cid in ("c00002", "c00003"):
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False)
    d, st = _decide(site, fleet, required=2)
    assert _outs(d) == [] and d.calls == []
    assert _floor_waits(site, d, st), (d.waiting_reason, st)


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_another_live_runs_floor_holds_at_every_site(site: Site) -> None:
    """Only the floor of another run sharing c00000 refuses (both of its two members must
    stay up); this run's own floor would let three go."""
    other = Floor("other/run-b", frozenset({CID, "c00001"}), required=2)
    d, st = _decide(site, make_fleet(4), required=1, floors=[other])
    assert _outs(d) == []
    assert _floor_waits(site, d, st), (d.waiting_reason, st)
    assert {c.cluster_id for c in d.calls} <= {"c00002", "c00003"}


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_no_fresh_verdict_asks_the_provider_before_anything_is_drained(site: Site) -> None:
    """Only the preflight refuses: c00000's verdict is stale (asked 90 s ago)."""
    fleet = make_fleet(4)
    verdicts = _accepted(fleet)
    verdicts[CID] = Preflight(Verdict.ACCEPTED, T0 - timedelta(seconds=90))
    d, st = _decide(site, fleet, preflight=verdicts)
    assert _outs(d) == [] and CID in d.preflight_needed
    before = site.status.phase if site.status is not None else U.PENDING
    assert st.phase == before  # nothing recorded while the provider is asked


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
@pytest.mark.parametrize(
    ("verdict", "reason"),
    [(Verdict.REFUSED_NEVER, "Refused"), (Verdict.REFUSED_LATER, "RefusedForNow")],
)
def test_a_refusing_provider_blocks_the_cluster_before_it_is_drained(
    site: Site, verdict: Verdict, reason: str
) -> None:
    fleet = make_fleet(4)
    verdicts = _accepted(fleet)
    verdicts[CID] = Preflight(verdict, T0, "SKIPS_MINOR", "1.28 to 1.30 skips a minor")
    d, st = _decide(site, fleet, preflight=verdicts)
    assert _outs(d) == []
    assert st.phase == U.BLOCKED and st.reason == reason and st.step is None, st
    assert "skips a minor" in (st.message or "")


# -- one order ----------------------------------------------------------------------------------


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_the_owner_is_asked_before_the_floor_and_the_provider(site: Site) -> None:
    """Held by another run, no budget and refused by the provider: the cluster waits for its
    holder; no refusal is recorded against this run and the provider is not asked."""
    fleet = make_fleet(4)
    for cid in ("c00002", "c00003"):
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False)
    refused = Preflight(Verdict.REFUSED_NEVER, T0 - timedelta(seconds=90), "X", "never")
    d, st = _decide(site, fleet, required=2, held_by={CID: "other/run-a"}, preflight={CID: refused})
    assert _outs(d) == [] and CID not in d.preflight_needed
    assert st.phase == U.PENDING and st.reason == "HeldByAnotherRun", st


@pytest.mark.parametrize("site", SITES, ids=lambda s: s.name)
def test_the_floor_is_asked_before_the_provider(site: Site) -> None:
    """No budget and no fresh verdict: the cluster waits for budget and no provider call is
    spent on it (a re-issue asked the provider first)."""
    fleet = make_fleet(4)
    for cid in ("c00002", "c00003"):
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False)
    d, st = _decide(site, fleet, required=2, preflight={})
    assert _outs(d) == [] and CID not in d.preflight_needed
    assert _floor_waits(site, d, st), (d.waiting_reason, st)


# -- the one exception: resuming our own service-out --------------------------------------------


def _ours_out(fleet: ModelFleet) -> api.ClusterUpgradeStatus:
    """c00000 Pending with this attempt's service-out on record (it waited, unconfirmed) and
    out of service since: the call took effect after all."""
    fleet.clusters[CID] = replace(fleet.clusters[CID], in_service=False)
    return api.ClusterUpgradeStatus(
        phase=U.PENDING, request_id=RID, reason="WaitingForBudget", message="waiting"
    )


def test_our_own_service_out_that_took_effect_is_resumed_without_floor_or_preflight() -> None:
    """Out of service by our own request: resuming it lowers nothing (it is down already) and
    the drain is done, so neither a broken floor nor a missing verdict holds it back, which
    would strand it out of service."""
    fleet = make_fleet(4)
    ours = _ours_out(fleet)
    for cid in ("c00002", "c00003"):
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False)
    d, by_id = decide_once(
        fleet, spec_for(fleet, NEW, required=3), {CID: ours}, AT, preflight_supported=True
    )
    st = status_after(d, by_id, CID)
    assert _outs(d) == [RID] and st.phase == U.SERVICING_OUT, (d.calls, st)
    assert CID not in d.preflight_needed


def test_our_own_service_out_is_not_resumed_while_another_run_holds_the_cluster() -> None:
    fleet = make_fleet(4)
    d, by_id = decide_once(
        fleet,
        spec_for(fleet, NEW, required=1),
        {CID: _ours_out(fleet)},
        AT,
        held_by={CID: "other/run-a"},
    )
    st = status_after(d, by_id, CID)
    assert _outs(d) == []
    assert st.phase == U.PENDING and st.reason == "HeldByAnotherRun", st
