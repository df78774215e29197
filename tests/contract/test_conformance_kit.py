"""The conformance kit passes a conformant plugin and fails deliberately broken ones."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk import errors, validate
from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sdk.conformance import run_conformance
from plugins.sdk.server import PluginServer, PluginServicers, ServerTLS, serve
from tests.contract.conftest import StartServer
from tests.support.certs import TestPKI
from tests.support.echo_plugin import ALL_CAPABILITIES, EchoCluster, echo_servicers

REPO = Path(__file__).resolve().parents[2]
Cap = identity_pb2.PluginCapability


@dataclass
class KitResult:
    """What one run of the kit reported."""

    code: int
    passed: list[str]
    failed: list[str]
    skipped: dict[str, str]  # test name -> reason


def _run_kit(
    server: PluginServer,
    tmp_path: Path,
    *pytest_args: str,
    tls: ClientTLS | None = None,
    cluster: str | None = None,
    timeout: float = 30.0,
    restart: Callable[[], None] | None = None,
) -> KitResult:
    report = tmp_path / f"kit-{len(list(tmp_path.iterdir()))}.xml"
    code = run_conformance(
        server.address,
        tls,
        cluster,
        timeout=timeout,
        pytest_args=["-q", f"--junitxml={report}", *pytest_args],
        restart=restart,
    )
    result = KitResult(code=code, passed=[], failed=[], skipped={})
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            result.failed.append(name)
        elif skipped is not None:
            result.skipped[name] = skipped.get("message", "")
        else:
            result.passed.append(name)
    return result


def _echo(clusters: int = 4, **kwargs: object) -> tuple[PluginServicers, EchoCluster]:
    servicers = echo_servicers(clusters, **kwargs)  # type: ignore[arg-type]
    assert isinstance(servicers.cluster, EchoCluster)
    return servicers, servicers.cluster


class _Restartable:
    """An echo plugin on a fixed port; restart() stops it and serves a fresh one there, as
    a restarted process would (operations survive only through the state_path journal)."""

    def __init__(self, registry: CollectorRegistry, state_path: str | None, clusters: int) -> None:
        self._registry = registry
        self._state_path = state_path
        self._clusters = clusters
        self._port = 0
        self.server = self._serve()

    def _serve(self) -> PluginServer:
        self.servicers, self.cluster = _echo(self._clusters, state_path=self._state_path)
        server = serve(
            f"127.0.0.1:{self._port}", self.servicers, plugin_name="echo", registry=self._registry
        )
        self._port = server.port
        return server

    def restart(self) -> None:
        self.stop()
        self.server = self._serve()

    def stop(self) -> None:
        self.cluster.store.close()
        self.server.stop(grace=0)


@pytest.fixture
def restartable(registry: CollectorRegistry) -> Iterator[Callable[..., _Restartable]]:
    started: list[_Restartable] = []

    def start(state_path: str | None, clusters: int = 4) -> _Restartable:
        plugin = _Restartable(registry, state_path, clusters)
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        plugin.stop()


# -- a conformant plugin passes ------------------------------------------------------------


def test_the_echo_plugin_passes_every_check_and_is_left_as_found(
    restartable: Callable[..., _Restartable], tmp_path: Path
) -> None:
    plugin = restartable(str(tmp_path / "state" / "ops.jsonl"), clusters=5)
    server = plugin.server
    result = _run_kit(server, tmp_path, restart=plugin.restart)
    assert result.code == 0, result.failed
    assert result.failed == []
    assert result.skipped == {}
    assert len(result.passed) >= 50
    with PluginClient(server.address) as client:
        clusters = client.list_clusters()
    assert [c.in_service for c in clusters] == [True] * 5
    assert {c.control_plane_version for c in clusters} == {"1.29.4"}


def test_a_plugin_with_fewer_capabilities_passes_with_reasoned_skips(
    start_server: StartServer, tmp_path: Path
) -> None:
    caps = frozenset({Cap.PLUGIN_CAPABILITY_CLUSTER_INVENTORY})
    servicers, _ = _echo(capabilities=caps)
    result = _run_kit(start_server(servicers), tmp_path)
    assert result.code == 0, result.failed
    assert "test_rpc_answers_unimplemented_exactly_outside_capabilities[ServiceOut]" in (
        result.passed
    )
    assert result.skipped
    assert all("capabilit" in reason for reason in result.skipped.values()), result.skipped


def test_instant_operations_skip_the_conflict_check_with_a_reason(
    start_server: StartServer, tmp_path: Path
) -> None:
    servicers, _ = _echo(op_seconds=0)
    result = _run_kit(start_server(servicers), tmp_path, "-k", "conflicting")
    assert result.code == 0
    assert list(result.skipped) == ["test_conflicting_request_is_aborted_naming_the_operation"]
    assert "finished at once" in next(iter(result.skipped.values()))
    assert result.passed == []


# -- broken plugins fail -------------------------------------------------------------------


class _DeclaresButRefuses(EchoCluster):
    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        raise errors.Unimplemented("not done yet")


class _NewOperationEveryTime(EchoCluster):
    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        first = self.store.lookup(request.request_id)
        if first is None:
            return super().ServiceOut(request, context)
        again = cluster_pb2.Operation()
        again.CopyFrom(first)
        again.id = f"{first.id}-again"  # a repeat "starts" another operation
        return cluster_pb2.ServiceOutResponse(operation=again)


class _NoConflicts(EchoCluster):
    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        try:
            return super().ServiceOut(request, context)
        except errors.Conflict:
            return cluster_pb2.ServiceOutResponse(
                operation=cluster_pb2.Operation(
                    id="op-sneaky",
                    kind=cluster_pb2.OPERATION_KIND_SERVICE_OUT,
                    cluster_id=request.cluster_id,
                    state=cluster_pb2.OPERATION_STATE_PENDING,
                    request_id=request.request_id,
                )
            )


class _SkipsAtPageEdges(EchoCluster):
    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        page = super().ListClusters(request, context)
        if page.next_page_token:
            last = validate.decode_page_token(page.next_page_token)
            skipped = last[:-1] + chr(ord(last[-1]) + 1)  # the next id: never listed
            page.next_page_token = validate.encode_page_token(skipped)
        return page


class _VagueErrors(EchoCluster):
    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        if not request.request_id:
            raise errors.InvalidArgument("request", "is bad")
        return super().ServiceIn(request, context)


class _SilentWatch(EchoCluster):
    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        yield from ()


class _PreflightStarts(EchoCluster):
    def PreflightUpgrade(
        self, request: cluster_pb2.PreflightUpgradeRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.PreflightUpgradeResponse:
        self.ServiceOut(
            cluster_pb2.ServiceOutRequest(request_id="sneaky-drain", cluster_id=request.cluster_id),
            context,
        )
        return super().PreflightUpgrade(request, context)


class _PreflightVague(EchoCluster):
    def PreflightUpgrade(
        self, request: cluster_pb2.PreflightUpgradeRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.PreflightUpgradeResponse:
        answer = super().PreflightUpgrade(request, context)
        answer.reason_code = ""
        return answer


class _NoReplay(EchoCluster):
    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        yield from self.store.changes(request.cluster_ids, request.include_in_flight, context, 0)


class _NoResync(EchoCluster):
    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        for response in super().WatchOperations(request, context):
            response.resync = False
            yield response


class _BareErrors(EchoCluster):
    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        try:
            return super().GetCluster(request, context)
        except errors.NotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, exc.message)
            raise


class _FindsEverything(EchoCluster):
    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        try:
            return super().GetCluster(request, context)
        except errors.NotFound:
            return cluster_pb2.GetClusterResponse(
                cluster=cluster_pb2.Cluster(id=request.cluster_id)
            )


@pytest.mark.parametrize(
    ("broken", "select", "failing"),
    [
        (
            _DeclaresButRefuses,
            "unimplemented",
            "test_rpc_answers_unimplemented_exactly_outside_capabilities[ServiceOut]",
        ),
        (
            _NewOperationEveryTime,
            "idempotent",
            "test_operation_is_idempotent_reaches_a_terminal_state_and_is_watched",
        ),
        (
            _NoConflicts,
            "conflicting",
            "test_conflicting_request_is_aborted_naming_the_operation",
        ),
        (
            _SkipsAtPageEdges,
            "paging",
            "test_paging_returns_every_cluster_once_in_id_order[size2]",
        ),
        (
            _VagueErrors,
            "invalid_argument_naming",
            "test_empty_required_field_is_invalid_argument_naming_it[ServiceIn-request_id]",
        ),
        (
            _SilentWatch,
            "idempotent",
            "test_operation_is_idempotent_reaches_a_terminal_state_and_is_watched",
        ),
        (_FindsEverything, "get_cluster_unknown", "test_get_cluster_unknown_id_is_not_found"),
        (_PreflightStarts, "preflight_changes", "test_preflight_changes_nothing"),
        (
            _PreflightVague,
            "impossible_target",
            "test_an_impossible_target_is_refused_with_a_reason",
        ),
        (
            _NoReplay,
            "resumed_watch",
            "test_a_resumed_watch_replays_the_changes_after_its_revision",
        ),
        (
            _NoResync,
            "cannot_be_replayed",
            "test_a_revision_that_cannot_be_replayed_answers_resync[ancient]",
        ),
        (_BareErrors, "carries_error_info", "test_not_found_carries_error_info"),
    ],
    ids=[
        "declares-but-refuses",
        "new-op-per-repeat",
        "no-conflicts",
        "skips-at-page-edges",
        "vague-errors",
        "silent-watch",
        "finds-everything",
        "preflight-starts-an-operation",
        "preflight-refuses-without-reason",
        "watch-ignores-since-revision",
        "watch-never-resyncs",
        "errors-without-details",
    ],
)
def test_a_broken_plugin_fails_the_check_it_breaks(
    start_server: StartServer,
    tmp_path: Path,
    broken: type[EchoCluster],
    select: str,
    failing: str,
) -> None:
    servicers, good = _echo(clusters=4)
    servicers.cluster = broken(good.fleet, good.store, good.op_seconds)
    result = _run_kit(start_server(servicers), tmp_path, "-k", select, timeout=3.0)
    assert result.code != 0
    assert failing in result.failed, result


def test_a_plugin_declaring_durability_that_forgets_on_restart_fails(
    restartable: Callable[..., _Restartable], tmp_path: Path
) -> None:
    plugin = restartable(None)  # DURABLE_OPERATIONS declared, operations kept in memory
    result = _run_kit(plugin.server, tmp_path, "-k", "survive", restart=plugin.restart)
    assert result.code != 0
    assert result.failed == ["test_operations_and_request_ids_survive_a_restart"], result


def test_without_a_restart_hook_durability_is_checked_in_part_and_said_so(
    start_server: StartServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    servicers, _ = _echo()
    result = _run_kit(start_server(servicers), tmp_path, "-k", "survive")
    assert result.code == 0
    assert result.passed == ["test_operations_and_request_ids_survive_a_restart"]
    assert "no restart hook was given" in capsys.readouterr().out


def test_a_capability_not_declared_must_answer_unimplemented(
    start_server: StartServer, tmp_path: Path
) -> None:
    # Without the SDK's enforcement the gate service answers although GATES is not declared.
    servicers, _ = _echo(capabilities=ALL_CAPABILITIES - {Cap.PLUGIN_CAPABILITY_GATES})
    server = start_server(servicers, enforce_capabilities=False)
    result = _run_kit(server, tmp_path, "-k", "unimplemented")
    assert result.code != 0
    assert "test_rpc_answers_unimplemented_exactly_outside_capabilities[ListGates]" in (
        result.failed
    )


# -- the command line ----------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugins.sdk.conformance", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_command_line_checks_an_mtls_endpoint(start_server: StartServer, pki: TestPKI) -> None:
    servicers, _ = _echo()
    server = start_server(
        servicers,
        tls=ServerTLS(pki.server.cert_file, pki.server.key_file, client_ca_file=pki.ca_file),
    )
    tls = ["--tls-ca", pki.ca_file, "--tls-cert", pki.client.cert_file]
    tls += ["--tls-key", pki.client.key_file]
    passed = _cli("--endpoint", server.address, *tls, "--cluster", "echo-002", "--timeout", "20")
    assert passed.returncode == 0, passed.stdout[-3000:]
    assert " passed" in passed.stdout
    no_cert = _cli("--endpoint", server.address, "--tls-ca", pki.ca_file, "--", "-k", "info")
    assert no_cert.returncode != 0
    assert "UNAVAILABLE" in no_cert.stdout


def test_the_command_line_fails_a_broken_plugin(start_server: StartServer) -> None:
    servicers, good = _echo()
    servicers.cluster = _FindsEverything(good.fleet, good.store)
    result = _cli("--endpoint", start_server(servicers).address, "--", "-k", "get_cluster")
    assert result.returncode == 1
    assert "test_get_cluster_unknown_id_is_not_found" in result.stdout


def test_the_library_refuses_an_empty_endpoint() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        run_conformance("")
