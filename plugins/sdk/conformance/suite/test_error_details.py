"""Conformance of error details: errors carry a google.rpc.ErrorInfo with the contract's reason
(domain fleetupgrade.io), and INVALID_ARGUMENT names the field in its metadata."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.conformance.suite._kit import UNKNOWN_ID, expect_error, require_rpc
from plugins.sdk.errors import ERROR_DOMAIN


def _check_info(error: PluginCallError, what: str) -> None:
    assert error.reason, (
        f"{what}: {error.code.name} without a google.rpc.ErrorInfo reason; send one "
        "(grpcio-status, or raise the SDK's PluginError types)"
    )
    assert error.domain == ERROR_DOMAIN, (
        f"{what}: ErrorInfo domain {error.domain!r}; the contract's reasons use {ERROR_DOMAIN!r}"
    )


def test_not_found_carries_error_info(client: PluginClient, capabilities: frozenset[int]) -> None:
    if identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY not in capabilities:
        pytest.skip("CLUSTER_INVENTORY is not among the declared capabilities")
    error = expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: client.get_cluster(UNKNOWN_ID),
        f"GetCluster({UNKNOWN_ID!r})",
    )
    _check_info(error, "GetCluster of an unknown cluster")
    assert not error.retryable, "NOT_FOUND must not carry a RetryInfo"


def test_invalid_argument_carries_the_field(
    client: PluginClient, capabilities: frozenset[int]
) -> None:
    require_rpc(capabilities, "GetOperation")
    error = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.get_operation(""),
        "GetOperation(operation_id='')",
    )
    _check_info(error, "GetOperation(operation_id='')")
    assert error.metadata.get("field") == "operation_id", (
        f"ErrorInfo metadata {error.metadata} should name the field: {{'field': 'operation_id'}}"
    )
