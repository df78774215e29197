"""A seeded adversary against the bridge: random mutations (new and repeated request ids),
bridge restarts with --state, an upstream that goes away or forgets its operations. After every
step: a request id always names the same operation, the upstream got exactly one call per
operation that had work to do, and never ran two operations on one cluster at once."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.legacy import LegacyBridge
from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.legacy.conftest import IDS, NEW, OLD, POOLS, StartBridge
from tests.support.kube import wait_for
from tests.support.legacy_server import LegacyServer

_K = cluster_pb2.OperationKind
_KINDS = (
    _K.OPERATION_KIND_SERVICE_OUT,
    _K.OPERATION_KIND_SERVICE_IN,
    _K.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
    _K.OPERATION_KIND_UPGRADE_NODE_POOL,
)
_TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)
_STEPS = 40


@dataclass
class World:
    """What the adversary asked and what it was answered."""

    asks: dict[str, tuple[int, str, str, str]] = field(default_factory=dict)  # rid → request
    op_of: dict[str, str] = field(default_factory=dict)  # rid → the operation id answered
    with_work: set[str] = field(default_factory=set)  # ops that were not done at once
    unseen: set[str] = field(default_factory=set)  # rids sent without an answer seen yet
    history: list[str] = field(default_factory=list)
    repeats: int = 0  # requests sent again after an answer


def _send(client: PluginClient, ask: tuple[int, str, str, str], rid: str) -> cluster_pb2.Operation:
    kind, cluster, pool, version = ask
    if kind == _K.OPERATION_KIND_SERVICE_OUT:
        return client.service_out(rid, cluster)
    if kind == _K.OPERATION_KIND_SERVICE_IN:
        return client.service_in(rid, cluster)
    if kind == _K.OPERATION_KIND_UPGRADE_CONTROL_PLANE:
        return client.upgrade_control_plane(rid, cluster, version)
    return client.upgrade_node_pool(rid, cluster, pool, version)


def _client(bridge: LegacyBridge) -> PluginClient:
    # Short deadlines: while the upstream is away, a call gives up after 2 s of retries.
    quick = dict.fromkeys(("ListClusters", "ServiceOut", "ServiceIn"), 2.0)
    quick |= dict.fromkeys(("UpgradeControlPlane", "UpgradeNodePool"), 2.0)
    return PluginClient(bridge.address, caller="adversary", timeouts=quick)


def _clusters(client: PluginClient) -> list[cluster_pb2.Cluster]:
    try:
        return client.list_clusters()
    except PluginCallError:
        return []  # the upstream is away


def _check(world: World, upstream: LegacyServer, seed: int) -> None:
    where = f"seed {seed}, after: {' | '.join(world.history[-6:])}"
    with upstream.model.lock:
        started = len(upstream.model.started)
        running = [op.cluster_id for op in upstream.model.operations.values() if op.status == 1]
    # Each operation with work reached the upstream once; a request whose answer the adversary
    # has not seen (its call failed on our side) may account for one more call, never two.
    known, unseen = len(world.with_work), len(world.unseen)
    assert known <= started <= known + unseen, (
        f"{started} upstream calls for {known} operations with work and {unseen} requests "
        f"without an answer ({where})"
    )
    assert len(running) == len(set(running)), f"two upstream operations on a cluster ({where})"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_request_is_sent_upstream_twice_whatever_happens(
    upstream: LegacyServer, start_bridge: StartBridge, state_file: Path, seed: int
) -> None:
    rng = random.Random(seed)
    world = World()
    upstream.model.ticks_per_operation = 4

    def start() -> LegacyBridge:
        return start_bridge(state_file=str(state_file), unknown_grace=0.3, upstream_timeout=5.0)

    bridge = start()
    client = _client(bridge)
    try:
        for step in range(_STEPS):
            roll = rng.random()
            if roll < 0.08:
                world.history.append(f"{step}: restart the bridge")
                client.close()
                bridge.stop(0)
                bridge = start()
                client = _client(bridge)
            elif roll < 0.12:
                world.history.append(f"{step}: the upstream forgets its operations")
                upstream.model.forget_operations()
            elif roll < 0.16:
                world.history.append(f"{step}: the upstream goes away and comes back")
                upstream.stop()
                _mutate(client, world, rng, step, listing=False)
                upstream.start()
            else:
                _mutate(client, world, rng, step)
            _check(world, upstream, seed)
        for rid in sorted(world.unseen):  # the caller's retry with the same request id
            wait_for(f"an answer to {rid}", lambda rid=rid: _answer(client, world, rid), timeout=20)
        assert not world.unseen
        for rid, op_id in world.op_of.items():
            wait_for(
                f"operation {op_id} ({rid}) ends",
                lambda op_id=op_id: client.get_operation(op_id).state in _TERMINAL,
                timeout=20,
            )
        _check(world, upstream, seed)
        # The run did real work: operations with upstream calls, and repeats of them.
        assert len(world.with_work) >= 3, world.history
        assert world.repeats >= 3, world.history
    finally:
        client.close()


def _mutate(
    client: PluginClient, world: World, rng: random.Random, step: int, listing: bool = True
) -> None:
    # Every draw is made whatever the bridge answered, so a seed makes the same choices however
    # the calls were timed; only which clusters are idle comes from the answers.
    repeat, pick, use_idle, kind = rng.random(), rng.random(), rng.random(), rng.choice(_KINDS)
    pool, work, version = rng.choice(POOLS), rng.random() < 0.8, rng.choice((OLD, NEW))
    answered = sorted(world.op_of)
    if answered and repeat < 0.2:  # a request the bridge answered, sent again
        rid = answered[int(pick * len(answered))]
        ask = world.asks[rid]
        world.repeats += 1
    elif repeat < 0.3 and world.asks:  # any request sent again, answered or not
        asked = sorted(world.asks)
        rid = asked[int(pick * len(asked))]
        ask = world.asks[rid]
        world.repeats += rid in world.op_of
    else:
        rid = f"adv-{step}"
        listed = {c.id: c for c in _clusters(client)} if listing else {}
        # Mostly a cluster with nothing in flight and a change with work to do; sometimes a
        # busy cluster (ABORTED) or a change already made (SUCCEEDED at once).
        idle = [cid for cid, c in listed.items() if not c.HasField("current_operation")]
        among = idle if idle and use_idle < 0.8 else list(IDS)
        cluster = among[int(pick * len(among))]
        seen = listed.get(cluster)
        if kind in (_K.OPERATION_KIND_SERVICE_OUT, _K.OPERATION_KIND_SERVICE_IN):
            if seen is not None and work:
                kind = (
                    _K.OPERATION_KIND_SERVICE_OUT
                    if seen.in_service
                    else _K.OPERATION_KIND_SERVICE_IN
                )
            ask = (kind, cluster, "", "")
        else:
            if seen is not None and work:
                now = seen.control_plane_version
                if kind == _K.OPERATION_KIND_UPGRADE_NODE_POOL:
                    now = next(p.version for p in seen.node_pools if p.name == pool)
                version = NEW if now == OLD else OLD
            upgrade_pool = pool if kind == _K.OPERATION_KIND_UPGRADE_NODE_POOL else ""
            ask = (kind, cluster, upgrade_pool, version)
    world.asks.setdefault(rid, ask)
    world.history.append(f"{step}: {_K.Name(ask[0])} {ask[1][-2:]} {ask[2]} {ask[3]} as {rid}")
    _answer(client, world, rid)


def _answer(client: PluginClient, world: World, rid: str) -> bool:
    """Sends the request; records the answer (True) or the refusal (False)."""
    try:
        op = _send(client, world.asks[rid], rid)
    except PluginCallError as exc:
        # Busy: nothing started. Upstream away, or our short deadline: maybe started.
        maybe = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert exc.code is grpc.StatusCode.ABORTED or exc.code in maybe, exc
        assert rid not in world.op_of, f"{rid} answered {world.op_of.get(rid)}, then {exc}"
        if exc.code in maybe:
            world.unseen.add(rid)
        return False
    world.unseen.discard(rid)
    first = world.op_of.setdefault(rid, op.id)
    assert op.id == first, f"{rid} answered {op.id} after {first}"
    done_at_once = op.state in _TERMINAL and op.end_time == op.start_time
    if not done_at_once:  # the upstream was called for it
        world.with_work.add(op.id)
    return True
