"""The conformance kit passes a conformant plugin and fails deliberately broken ones."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk import errors, validate
from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sdk.conformance import run_conformance
from plugins.sdk.server import PluginServer, PluginServicers, ServerTLS
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
) -> KitResult:
    report = tmp_path / f"kit-{len(list(tmp_path.iterdir()))}.xml"
    code = run_conformance(
        server.address,
        tls,
        cluster,
        timeout=timeout,
        pytest_args=["-q", f"--junitxml={report}", *pytest_args],
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


# -- a conformant plugin passes ------------------------------------------------------------


def test_the_echo_plugin_passes_every_check_and_is_left_as_found(
    start_server: StartServer, tmp_path: Path
) -> None:
    servicers, _ = _echo(clusters=5)
    server = start_server(servicers)
    result = _run_kit(server, tmp_path)
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
    ],
    ids=[
        "declares-but-refuses",
        "new-op-per-repeat",
        "no-conflicts",
        "skips-at-page-edges",
        "vague-errors",
        "silent-watch",
        "finds-everything",
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
