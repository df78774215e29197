"""The SDK client: retries, deadlines, errors, paging, watches, metadata and metrics hook."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc, identity_pb2
from plugins.sdk import errors
from plugins.sdk.client import PluginCallError, PluginClient, is_retryable, supports
from plugins.sdk.server import PluginServer, PluginServicers
from tests.contract.conftest import StartServer
from tests.support.echo_plugin import EchoIdentity, echo_servicers


class _Counting(EchoIdentity):
    """Identity whose GetPluginInfo fails the first `failures` calls with UNAVAILABLE."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.info_calls = 0
        self.capability_calls = 0
        self.callers: list[str] = []
        self.lock = threading.Lock()

    def GetPluginInfo(
        self, request: identity_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> identity_pb2.GetPluginInfoResponse:
        with self.lock:
            self.info_calls += 1
            attempt = self.info_calls
            self.callers.extend(
                str(v) for k, v in context.invocation_metadata() if k == "x-fleetupgrade-caller"
            )
        if attempt <= self.failures:
            raise errors.Unavailable("provider warming up")
        return super().GetPluginInfo(request, context)

    def GetPluginCapabilities(
        self, request: identity_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> identity_pb2.GetPluginCapabilitiesResponse:
        with self.lock:
            self.capability_calls += 1
        return super().GetPluginCapabilities(request, context)


class _Odd(cluster_pb2_grpc.ClusterServiceServicer):
    """Cluster service with slow, missing and broken answers, counting GetCluster calls."""

    def __init__(self) -> None:
        self.get_calls = 0
        self.release = threading.Event()

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        self.get_calls += 1
        if request.cluster_id == "slow":
            self.release.wait(5)
        if request.cluster_id == "aborted":
            raise errors.Conflict("cluster c busy with op-3", "op-3")
        raise errors.NotFound(f"cluster {request.cluster_id} not found")

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        raise errors.Conflict("cluster c busy with op-3", "op-3")

    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        return cluster_pb2.ListClustersResponse(
            clusters=[cluster_pb2.Cluster(id="a")], next_page_token="same", total_size=9
        )

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        yield cluster_pb2.WatchOperationsResponse(operation=cluster_pb2.Operation(id="op-1"))
        raise errors.Unavailable("provider connection lost")


@pytest.fixture
def odd(start_server: StartServer) -> Iterator[tuple[_Odd, _Counting, PluginServer]]:
    cluster = _Odd()
    identity = _Counting(failures=0)
    server = start_server(PluginServicers(identity=identity, cluster=cluster))
    yield cluster, identity, server
    cluster.release.set()


def test_unavailable_is_retried_until_the_call_succeeds(start_server: StartServer) -> None:
    identity = _Counting(failures=2)
    server = start_server(PluginServicers(identity=identity))
    with PluginClient(server.address, caller="orchestrator-0") as client:
        assert client.info().name == "echo.test.fleetupgrade.io"
    assert identity.info_calls == 3
    assert identity.callers == ["orchestrator-0"] * 3


def test_retries_stop_after_five_attempts(start_server: StartServer) -> None:
    identity = _Counting(failures=100)
    server = start_server(PluginServicers(identity=identity))
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.info()
    assert identity.info_calls == 5
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    assert info.value.retryable
    assert info.value.message == "provider warming up"


def test_errors_other_than_unavailable_are_not_retried(
    odd: tuple[_Odd, _Counting, PluginServer],
) -> None:
    cluster, _, server = odd
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.get_cluster("missing")
    assert cluster.get_calls == 1
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert not info.value.retryable
    assert info.value.rpc == "GetCluster"
    assert str(info.value) == "GetCluster: NOT_FOUND: cluster missing not found"


def test_deadline_exceeded_is_a_retryable_plugin_call_error(
    odd: tuple[_Odd, _Counting, PluginServer],
) -> None:
    _, _, server = odd
    client = PluginClient(server.address, timeouts={"GetCluster": 0.3}, plugin_name="odd")
    started = time.monotonic()
    with client, pytest.raises(PluginCallError) as info:
        client.get_cluster("slow")
    assert time.monotonic() - started < 3.0
    assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.retryable
    assert info.value.plugin == "odd"


def test_aborted_carries_the_operation_and_is_retryable_only_for_reads(
    odd: tuple[_Odd, _Counting, PluginServer],
) -> None:
    _, _, server = odd
    with PluginClient(server.address) as client:
        with pytest.raises(PluginCallError) as read:
            client.get_cluster("aborted")
        with pytest.raises(PluginCallError) as write:
            client.service_out("r-1", "c")
    assert read.value.code is write.value.code is grpc.StatusCode.ABORTED
    assert read.value.retryable
    assert not write.value.retryable
    assert write.value.operation_id == "op-3"


@pytest.mark.parametrize(
    ("rpc", "code", "retryable"),
    [
        ("GetCluster", grpc.StatusCode.UNAVAILABLE, True),
        ("ServiceOut", grpc.StatusCode.DEADLINE_EXCEEDED, True),
        ("ListClusters", grpc.StatusCode.RESOURCE_EXHAUSTED, True),
        ("ListClusters", grpc.StatusCode.ABORTED, True),
        ("UpgradeNodePool", grpc.StatusCode.ABORTED, False),
        ("GetCluster", grpc.StatusCode.UNIMPLEMENTED, False),
        ("ServiceIn", grpc.StatusCode.INVALID_ARGUMENT, False),
        ("GetOperation", grpc.StatusCode.NOT_FOUND, False),
        ("UpgradeControlPlane", grpc.StatusCode.FAILED_PRECONDITION, False),
    ],
)
def test_retryable_follows_the_contract_error_table(
    rpc: str, code: grpc.StatusCode, retryable: bool
) -> None:
    assert is_retryable(rpc, code) is retryable


def test_supports_maps_rpcs_to_capabilities() -> None:
    cap = identity_pb2.PluginCapability
    upgrades = frozenset({cap.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL})
    assert supports(upgrades, "UpgradeNodePool")
    assert supports(upgrades, "WatchOperations")
    assert not supports(upgrades, "ServiceOut")
    assert supports(frozenset(), "Probe")


def test_capabilities_are_asked_once(odd: tuple[_Odd, _Counting, PluginServer]) -> None:
    _, identity, server = odd
    before = identity.capability_calls  # serve() asks once itself, at start
    with PluginClient(server.address) as client:
        first = client.capabilities()
        assert client.capabilities() == first
        assert identity_pb2.PLUGIN_CAPABILITY_GATES in first
    assert identity.capability_calls - before == 1


def test_list_clusters_follows_every_page(start_server: StartServer) -> None:
    server = start_server(echo_servicers(clusters=7))
    with PluginClient(server.address) as client:
        ids = [c.id for c in client.list_clusters(page_size=2)]
        canary = [c.id for c in client.list_clusters({"stage": "canary"}, page_size=3)]
    assert ids == [f"echo-{i:03d}" for i in range(7)]
    assert canary == ["echo-000", "echo-002", "echo-004", "echo-006"]


def test_a_repeated_page_token_is_reported_not_followed_forever(
    odd: tuple[_Odd, _Counting, PluginServer],
) -> None:
    _, _, server = odd
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.list_clusters()
    assert info.value.code is grpc.StatusCode.INTERNAL
    assert "next_page_token" in info.value.message


def test_watch_delivers_updates_and_cancel_ends_it_quietly(start_server: StartServer) -> None:
    server = start_server(echo_servicers(op_seconds=0.5))
    seen: list[cluster_pb2.Operation] = []
    finished = threading.Event()
    with PluginClient(server.address) as client:
        watch = client.watch_operations(["echo-001"])

        def read() -> None:
            for op in watch:
                seen.append(op)
            finished.set()

        reader = threading.Thread(target=read)
        reader.start()
        op = _start_when_watched(client, "echo-001")
        _wait(
            lambda: any(
                o.id == op.id and o.state == cluster_pb2.OPERATION_STATE_SUCCEEDED for o in seen
            ),
            "terminal update",
        )
        watch.cancel()
        assert finished.wait(5), "iteration did not end after cancel()"
        reader.join(5)
    assert {o.id for o in seen} == {op.id}
    assert seen[-1].state == cluster_pb2.OPERATION_STATE_SUCCEEDED


def test_a_failing_watch_raises_plugin_call_error(
    odd: tuple[_Odd, _Counting, PluginServer],
) -> None:
    _, _, server = odd
    received: list[str] = []
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        for op in client.watch_operations():
            received.append(op.id)
    assert received == ["op-1"]
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    assert info.value.rpc == "WatchOperations"


def test_every_call_reaches_the_on_call_hook(odd: tuple[_Odd, _Counting, PluginServer]) -> None:
    _, _, server = odd
    calls: list[tuple[str, grpc.StatusCode]] = []
    client = PluginClient(server.address, on_call=lambda rpc, code, _s: calls.append((rpc, code)))
    with client:
        client.probe()
        with pytest.raises(PluginCallError):
            client.get_cluster("x")
    assert calls == [("Probe", grpc.StatusCode.OK), ("GetCluster", grpc.StatusCode.NOT_FOUND)]


class _Flaky(cluster_pb2_grpc.ClusterServiceServicer):
    """ServiceOut answers UNAVAILABLE `failures` times, then an operation; PreflightUpgrade
    answers only when released."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.service_out_calls = 0
        self.release = threading.Event()

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        self.service_out_calls += 1
        if self.service_out_calls <= self.failures:
            raise errors.Unavailable("provider warming up")
        op = cluster_pb2.Operation(
            id=f"op-{request.cluster_id}",
            cluster_id=request.cluster_id,
            request_id=request.request_id,
            kind=cluster_pb2.OPERATION_KIND_SERVICE_OUT,
            state=cluster_pb2.OPERATION_STATE_RUNNING,
        )
        return cluster_pb2.ServiceOutResponse(operation=op)

    def PreflightUpgrade(
        self, request: cluster_pb2.PreflightUpgradeRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.PreflightUpgradeResponse:
        self.release.wait(5)
        return cluster_pb2.PreflightUpgradeResponse(verdict=cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED)


def test_a_started_call_is_retried_and_answers_as_a_blocking_one(
    start_server: StartServer,
) -> None:
    cluster = _Flaky(failures=2)
    server = start_server(PluginServicers(identity=EchoIdentity(), cluster=cluster))
    calls: list[tuple[str, grpc.StatusCode, float]] = []
    with PluginClient(server.address, on_call=lambda *c: calls.append(c)) as client:
        pending = client.start_service_out("r-1", "c-7")
        op = pending.result()
    # The channel's retries (UNAVAILABLE twice) happened under the one started call.
    assert cluster.service_out_calls == 3
    assert (op.id, op.cluster_id, op.request_id) == ("op-c-7", "c-7", "r-1")
    assert [(rpc, code) for rpc, code, _ in calls] == [("ServiceOut", grpc.StatusCode.OK)]
    assert calls[0][2] > 0


def test_a_started_call_fails_as_the_blocking_one_does(
    odd: tuple[_Odd, _Counting, PluginServer], start_server: StartServer
) -> None:
    _, _, server = odd
    with PluginClient(server.address, plugin_name="odd") as client:
        with pytest.raises(PluginCallError) as blocking:
            client.service_out("r-1", "c")
        with pytest.raises(PluginCallError) as started:
            client.start_service_out("r-1", "c").result()
    for err in (blocking.value, started.value):
        assert err.code is grpc.StatusCode.ABORTED
        assert not err.retryable
        assert err.operation_id == "op-3"
    assert str(started.value) == str(blocking.value)
    # Its deadline is the RPC's own, from when it was started.
    slow = _Flaky(failures=0)
    server = start_server(PluginServicers(identity=EchoIdentity(), cluster=slow))
    client = PluginClient(server.address, timeouts={"PreflightUpgrade": 0.3})
    started_at = time.monotonic()
    with client, pytest.raises(PluginCallError) as late:
        client.start_preflight_upgrade("c", "1.30.0").result()
    slow.release.set()
    assert time.monotonic() - started_at < 3.0
    assert late.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert late.value.retryable


def test_unknown_timeout_names_are_refused() -> None:
    with pytest.raises(ValueError, match="GetClusterz"):
        PluginClient("127.0.0.1:1", timeouts={"GetClusterz": 1.0})


def _start_when_watched(client: PluginClient, cluster_id: str) -> cluster_pb2.Operation:
    # The contract gives no acknowledgement that a watch is registered; echo's operation
    # takes 0.5 s, and the watch (include_in_flight) catches an in-flight op in any case.
    return client.service_out("watch-test-1", cluster_id)


def _wait(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
