"""PreflightUpgrades (the SDK's ClusterServicer, over real gRPC): each item is answered as
PreflightUpgrade answers it (the same verdict, or the same error: code, words, reason), in
order, one item's error keeping to it; a plugin without it answers UNIMPLEMENTED once and the
caller asks PreflightUpgrade of each cluster instead."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from orchestrator.engine.decide import Verdict
from orchestrator.pipeline.driver import CallError, StartsBatches
from plugins.sdk import errors, preflight
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.identity import StaticIdentity
from plugins.sdk.server import PluginServicers
from plugins.sdk.servicers import MAX_OPERATION_ITEMS, ClusterServicer
from plugins.sim import SimOptions
from tests.contract.conftest import StartServer, grpc_provider

Cap = identity_pb2.PluginCapability
Answer = cluster_pb2.PreflightUpgradeResponse | PluginCallError


@pytest.fixture
def sim_options() -> SimOptions:
    return SimOptions(generate=4, step_seconds=30, seed=5, registry=CollectorRegistry())


def _batch(client: PluginClient, items: list[cluster_pb2.PreflightUpgradeRequest]) -> list[Answer]:
    pending = client.start_preflights(items)
    assert pending is not None, "the SDK's ClusterServicer offers PreflightUpgrades"
    return pending.results()


def _single(client: PluginClient, cid: str, version: str, pools: Mapping[str, str]) -> Answer:
    try:
        return client.preflight_upgrade(cid, version, pools)
    except PluginCallError as err:
        return err


def _same(got: Answer, want: Answer) -> None:
    if isinstance(want, PluginCallError):
        assert isinstance(got, PluginCallError), got
        assert (got.rpc, got.code, got.message, got.reason, got.retryable) == (
            want.rpc,
            want.code,
            want.message,
            want.reason,
            want.retryable,
        )
        return
    assert isinstance(got, cluster_pb2.PreflightUpgradeResponse), got
    assert (got.verdict, got.reason_code, got.message) == (
        want.verdict,
        want.reason_code,
        want.message,
    )
    # A busy cluster's wait counts down between the two asks.
    assert abs(got.retry_after_seconds - want.retry_after_seconds) <= 1


def test_each_item_answers_as_preflight_upgrade_in_order(client: PluginClient) -> None:
    c1, c2, c3, c4 = sorted(c.id for c in client.list_clusters())
    third = client.get_cluster(c3)
    pool, cp = third.node_pools[0].name, third.control_plane_version
    client.service_out("busy-1", c4)  # c4 now runs an operation (steps of 30 s)
    cases: list[tuple[str, str, dict[str, str]]] = [
        (c1, "1.30.1", {}),
        ("no-such-cluster", "1.30.1", {}),  # NOT_FOUND
        (c2, "not-a-version", {}),  # INVALID_ARGUMENT
        (c2, "", {}),  # INVALID_ARGUMENT: nothing asked
        (c3, "", {pool: cp}),  # a verdict
        (c4, "", {pool: cp}),  # REFUSED_LATER: an operation in flight
    ]
    items = [client.preflight_request(*case) for case in cases]
    batched = _batch(client, items)
    singles = [_single(client, *case) for case in cases]
    assert len(batched) == len(cases)
    for got, want in zip(batched, singles, strict=True):
        _same(got, want)
    codes = [b.code for b in batched if isinstance(b, PluginCallError)]
    assert codes == [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    busy = batched[5]
    assert isinstance(busy, cluster_pb2.PreflightUpgradeResponse)
    assert busy.verdict == cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER
    assert busy.reason_code == errors.Reason.CLUSTER_BUSY


def test_a_whole_request_out_of_bounds_is_refused(client: PluginClient) -> None:
    for count in (0, MAX_OPERATION_ITEMS + 1):
        answers = _batch(client, [client.preflight_request("c", "1.30.1")] * count)
        assert len(answers) == count
        if count:
            first = answers[0]
            assert isinstance(first, PluginCallError)
            assert first.code is grpc.StatusCode.INVALID_ARGUMENT
            assert "split the batch" in first.message
            assert all(isinstance(a, PluginCallError) for a in answers)


class _Backend:
    """A preflight that refuses minor 31 for good, crashes on cluster "crash", and cannot reach
    its provider for cluster "down"."""

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        if cluster_id == "crash":
            raise RuntimeError("secret-token-123 leaked")
        if cluster_id == "down":
            raise errors.Unavailable("provider API unreachable", retry_after=7)
        if control_plane_version.startswith("1.31."):
            return preflight.refused_never(errors.Reason.VERSION_NOT_OFFERED, "1.31 is not offered")
        return preflight.accepted()


def _serve(start_server: StartServer, *caps: int) -> str:
    identity = StaticIdentity("p", "1.0.0", list(caps))
    servicers = PluginServicers(identity=identity, cluster=ClusterServicer(_Backend()))  # type: ignore[arg-type]
    return start_server(servicers).address


def test_errors_and_crashes_keep_to_their_item_and_each_is_counted_as_its_rpc(
    start_server: StartServer, registry: CollectorRegistry
) -> None:
    address = _serve(start_server, Cap.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE)

    def count(method: str, code: str) -> float | None:
        labels = {"plugin": "test", "method": f"ClusterService/{method}", "code": code}
        return registry.get_sample_value("fleet_plugin_rpc_total", labels)

    with PluginClient(address) as client:
        asked = [("a", "1.30.1"), ("crash", "1.30.1"), ("b", "1.31.0"), ("down", "1.30.1")]
        out = _batch(client, [client.preflight_request(*q) for q in asked])
        # Each item as its own RPC (a plugin's counts per RPC are the same batched or not),
        # the batch once.
        assert count("PreflightUpgrade", "OK") == 2
        assert count("PreflightUpgrade", "INTERNAL") == 1
        assert count("PreflightUpgrade", "UNAVAILABLE") == 1
        assert count("PreflightUpgrades", "OK") == 1
        with pytest.raises(PluginCallError) as single:
            client.preflight_upgrade("down", "1.30.1")
    accepted, crashed, refused, down = out
    assert isinstance(accepted, cluster_pb2.PreflightUpgradeResponse)
    assert accepted.verdict == cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
    assert isinstance(crashed, PluginCallError) and crashed.code is grpc.StatusCode.INTERNAL
    assert "secret-token" not in crashed.message  # the exception's words stay in the log
    assert isinstance(refused, cluster_pb2.PreflightUpgradeResponse)
    assert refused.verdict == cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER
    assert isinstance(down, PluginCallError)
    assert (down.code, down.retry_after) == (grpc.StatusCode.UNAVAILABLE, 7.0)
    assert (down.message, down.reason) == (single.value.message, single.value.reason)


def test_the_adapter_answers_each_question_or_raises_its_error(start_server: StartServer) -> None:
    address = _serve(start_server, Cap.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE)
    with PluginClient(address) as client:
        provider = grpc_provider(client)
        assert isinstance(provider, StartsBatches)
        answers = provider.start_preflights(
            [("a", "1.30.1", {}), ("down", "1.30.1", {}), ("b", "1.31.0", {"pool": "1.31.0"})]
        )
        assert answers is not None and len(answers) == 3
        assert answers[0]().verdict == Verdict.ACCEPTED
        with pytest.raises(CallError) as down:
            answers[1]()
        never = answers[2]()
    assert down.value.code == "UNAVAILABLE" and down.value.retryable
    assert (never.verdict, never.reason) == (Verdict.REFUSED_NEVER, "VERSION_NOT_OFFERED")


def test_a_plugin_without_the_capability_refuses_the_batch_as_the_rpc(
    start_server: StartServer,
) -> None:
    address = _serve(start_server, Cap.PLUGIN_CAPABILITY_CLUSTER_SERVICE)
    with PluginClient(address) as client:
        assert client.start_preflights([client.preflight_request("a", "1.30.1")]) is None
        with pytest.raises(PluginCallError) as single:
            client.preflight_upgrade("a", "1.30.1")
    assert single.value.code is grpc.StatusCode.UNIMPLEMENTED


def test_a_plugin_without_it_is_asked_once_then_each_cluster_is_asked(
    echo_client: PluginClient,
) -> None:
    client = echo_client
    provider = grpc_provider(client)
    cid = sorted(c.id for c in client.list_clusters())[0]
    version = client.get_cluster(cid).control_plane_version
    assert provider.start_preflights([(cid, version, {})]) is None  # UNIMPLEMENTED
    assert provider.start_preflights([(cid, version, {})]) is None  # not asked again
    assert provider.start_preflight(cid, version, {})().verdict in set(Verdict)
    # StartOperations is a separate question: not answered for it.
    assert client.batches()
