"""A cluster's node pools in one intent (status.nextRequestIds, issue 21's writes per step):
every pool short of target is persisted with the first one's intent (invariant 6), and each
pool after it starts, once the one before it succeeded, without a write of its own; a failure,
a timeout or a refused call puts the pool it concerns on record; a stopping run starts no
pool of a chain; a chain this attempt did not make is not followed."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orchestrator import api
from orchestrator.engine.decide import (
    Call,
    Decision,
    RunInput,
    call_failed,
    chain_of,
    decide,
    request_id,
    with_status,
)
from orchestrator.engine.observations import OpKind, OpObs, OpState, PoolObs, Snapshot
from orchestrator.pipeline.simulate import T0
from tests.engine.model import U, as_run_spec, make_fleet, pinned, spec_for

NEW = "1.29.1"
UID = "uid-1"
CID = "c00000"
START = "2026-01-01T00:00:00Z"


def _rid(step: str, target: str = NEW, attempt: int = 0) -> str:
    return request_id(UID, CID, step, target, attempt)


CP, POOL0, POOL1, POOL2 = (
    _rid("controlPlane"),
    _rid("nodePool/pool-0"),
    _rid("nodePool/pool-1"),
    _rid("nodePool/pool-2"),
)


def _decide(
    status: api.ClusterUpgradeStatus,
    ops: dict[str, OpObs],
    *,
    cp: str = NEW,
    pools: tuple[str, ...] = ("1.28.5", "1.28.5", "1.28.5"),
    seconds: float = 5.0,
    stop: bool = False,
    gone: bool = False,
    forgotten: frozenset[str] = frozenset(),
) -> tuple[Decision, api.ClusterUpgradeStatus]:
    """One decision on c00000 (out of service, control plane at cp, its pools at `pools`)."""
    fleet = make_fleet(3, pools=len(pools))
    fleet.clusters[CID] = replace(
        fleet.clusters[CID],
        in_service=False,
        control_plane_version=cp,
        node_pools=tuple(PoolObs(f"pool-{i}", v) for i, v in enumerate(pools)),
    )
    spec = spec_for(fleet, NEW, required=1)
    by_id = pinned(fleet, spec)
    u = with_status(by_id[CID], status)
    run_spec = as_run_spec(spec)
    if stop:
        run_spec = run_spec.model_copy(update={"state": api.RunState.STOP})
    inp = RunInput(
        key="ns/run",
        uid=UID,
        spec=run_spec,
        upgrades={**{x.name: x for x in by_id.values()}, u.name: u},
        snapshot=Snapshot(
            {c: o for c, o in fleet.clusters.items() if not (gone and c == CID)}, ops, forgotten
        ),
        now=T0 + timedelta(seconds=seconds),
        preflight_supported=False,
    )
    d = decide(inp)
    return d, d.changed.get(u.name, u.status)


def _op(rid: str, state: OpState, kind: OpKind = OpKind.NODE_POOL, pool: str = "") -> OpObs:
    return OpObs(f"op-{rid.rsplit(':', 3)[1]}", kind, CID, state, rid, pool, NEW)


def _chain(first: str = POOL0, *rest: str) -> api.ClusterUpgradeStatus:
    return api.ClusterUpgradeStatus(
        phase=U.UPGRADING_NODE_POOLS,
        step=first.rsplit(":", 3)[1],
        request_id=first,
        next_request_ids=list(rest) or None,
        step_start_time=START,
        start_time=START,
    )


def _mine(d: Decision) -> list[Call]:
    return [c for c in d.calls if c.cluster_id == CID]


def test_every_pool_short_of_target_is_persisted_with_the_first_pools_intent() -> None:
    upgrading_cp = api.ClusterUpgradeStatus(
        phase=U.UPGRADING_CONTROL_PLANE,
        step="controlPlane",
        request_id=CP,
        step_start_time=START,
        start_time=START,
    )
    done = _op(CP, OpState.SUCCEEDED, OpKind.CONTROL_PLANE)
    d, st = _decide(upgrading_cp, {CP: done}, pools=("1.28.5", NEW, "1.28.5"))
    # pool-1 is at target already: only pool-0 and pool-2 are upgraded.
    assert st.step == "nodePool/pool-0" and st.request_id == POOL0
    assert st.next_request_ids == [POOL2]
    ((call,),) = [_mine(d)]
    assert call.request_id == POOL0 and call.node_pool == "pool-0"


def test_the_next_pool_starts_without_a_write_once_the_one_before_succeeded() -> None:
    status = _chain(POOL0, POOL1, POOL2)
    d, st = _decide(status, {POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0")})
    assert st is status, "the pool's turn in the chain wrote the status"
    ((call,),) = [_mine(d)]
    assert call.request_id == POOL1 and call.node_pool == "pool-1" and call.version == NEW
    # Followed on the next pass (its operation known): nothing written, nothing asked again.
    ops = {
        POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0"),
        POOL1: _op(POOL1, OpState.RUNNING, pool="pool-1"),
    }
    d, st = _decide(status, ops, pools=(NEW, "1.28.5", "1.28.5"))
    assert st is status and _mine(d) == []
    # The last one succeeded: the next step is written, the chain gone with it.
    ops[POOL1] = _op(POOL1, OpState.SUCCEEDED, pool="pool-1")
    ops[POOL2] = _op(POOL2, OpState.SUCCEEDED, pool="pool-2")
    d, st = _decide(status, ops)
    assert st.phase == U.SERVICING_IN and st.next_request_ids is None
    assert [c.kind for c in _mine(d)] == [OpKind.SERVICE_IN]


def test_a_chained_pool_that_fails_is_on_record_as_the_step_that_failed() -> None:
    ops = {
        POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0"),
        POOL1: _op(POOL1, OpState.FAILED, pool="pool-1"),
    }
    d, st = _decide(_chain(POOL0, POOL1, POOL2), ops)
    assert st.phase == U.FAILED and st.reason == "OperationFailed"
    assert st.step == "nodePool/pool-1" and st.request_id == POOL1
    assert st.next_request_ids == [POOL2]
    assert _mine(d) == []


def test_a_chained_pool_is_bounded_by_one_step_timeout_per_pool_up_to_it() -> None:
    bound = api.parse_duration(api.StepTimeouts().node_pool).total_seconds()
    ops = {
        POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0"),
        POOL1: _op(POOL1, OpState.RUNNING, pool="pool-1"),
    }
    _, st = _decide(_chain(POOL0, POOL1), ops, seconds=2 * bound - 1)
    assert st.phase == U.UPGRADING_NODE_POOLS and st.step == "nodePool/pool-0"
    _, st = _decide(_chain(POOL0, POOL1), ops, seconds=2 * bound + 1)
    assert st.phase == U.FAILED and st.reason == "StepTimedOut"
    assert st.step == "nodePool/pool-1" and st.request_id == POOL1


def test_a_refused_chained_pool_is_on_record_as_the_step_refused() -> None:
    call = Call(OpKind.NODE_POOL, CID, POOL1, "x", NEW, "pool-1")
    new, wait = call_failed(_chain(POOL0, POOL1, POOL2), call, "INVALID_ARGUMENT", False, "no", T0)
    assert wait is None and new.phase == U.FAILED
    assert new.step == "nodePool/pool-1" and new.request_id == POOL1
    assert new.next_request_ids == [POOL2]


def test_a_stopping_run_starts_no_pool_of_a_chain() -> None:
    d, st = _decide(
        _chain(POOL0, POOL1), {POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0")}, stop=True
    )
    assert all(c.kind is not OpKind.NODE_POOL for c in _mine(d))
    assert st.next_request_ids is None and st.phase in (U.VERIFYING, U.SERVICING_IN)


def test_a_chain_this_attempt_did_not_make_is_not_followed() -> None:
    other = _rid("nodePool/pool-1", attempt=7)
    status = _chain(POOL0, other)
    fleet = make_fleet(3)
    assert chain_of(UID, with_status(pinned(fleet, spec_for(fleet, NEW, 1))[CID], status)) == ()
    d, st = _decide(status, {POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0")})
    ((call,),) = [_mine(d)]
    # pool-1 gets an intent of its own, written before its call.
    assert call.request_id == POOL1 and st.request_id == POOL1 and st.step == "nodePool/pool-1"


def test_a_chain_whose_cluster_left_the_inventory_waits_one_step_timeout_per_pool() -> None:
    bound = api.parse_duration(api.StepTimeouts().node_pool).total_seconds()
    status = _chain(POOL0, POOL1, POOL2)
    _, st = _decide(status, {}, seconds=2 * bound, gone=True)
    assert st.phase == U.UPGRADING_NODE_POOLS, "left before the chain's bound"
    _, st = _decide(status, {}, seconds=3 * bound + 1, gone=True)
    assert st.phase == U.SKIPPED and st.reason == "ClusterGone"


def test_a_chained_pool_the_plugin_forgot_is_lost_never_asked_again() -> None:
    """Invariant 6: the plugin restarted without durable operations and forgot pool-1's
    operation; whether it ran is unknown, so it is not asked again (OperationLost)."""
    ops = {POOL0: _op(POOL0, OpState.SUCCEEDED, pool="pool-0")}
    d, st = _decide(_chain(POOL0, POOL1, POOL2), ops, forgotten=frozenset({POOL1}))
    assert _mine(d) == []
    assert st.phase == U.FAILED and st.reason == "OperationLost"
    assert st.step == "nodePool/pool-1" and st.request_id == POOL1
