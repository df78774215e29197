"""EKS's errors as the contract's codes (docs/plugins/eks.md, "Errors"): ResourceInUseException
→ ABORTED naming the update, throttling and 5xx → UNAVAILABLE (retryable; the same request_id
then starts one update), InvalidParameterException → FAILED_PRECONDITION for good,
InvalidRequestException / InvalidStateException → FAILED_PRECONDITION with RetryInfo,
ResourceNotFoundException → NOT_FOUND. EKS's words and the credentials never reach an answer or
a log line."""

from __future__ import annotations

import logging

import grpc
import pytest

from plugins.eks import parse_config
from plugins.eks.api import EksApi
from plugins.sdk.client import PluginCallError
from plugins.sdk.errors import FailedPrecondition, NotFound, PluginError, Unavailable
from tests.plugins.eks.conftest import SECRET, StartPlugin
from tests.plugins.eks.support import NEW, OLD, REGION, cluster_id, plugin_config
from tests.support.eks_emulator import EksEmulator
from tests.support.plugin_harness import wait_terminal


@pytest.mark.parametrize(
    "fault", ["ThrottlingException", "ServerException", "ServiceUnavailableException"]
)
def test_throttling_and_5xx_are_unavailable_and_the_retry_starts_one_update(
    emulator: EksEmulator, start_plugin: StartPlugin, fault: str
) -> None:
    client = start_plugin().client
    # The gRPC client retries UNAVAILABLE itself (5 attempts in its service config): one
    # fault is absorbed there with one update started; five reach the caller.
    emulator.inject("UpdateClusterVersion", fault, count=1)
    emulator.held = True
    first = client.upgrade_control_plane("r-0", cluster_id("c2"), NEW)
    assert emulator.cluster(REGION, "c2")["updates"] == [("", NEW, "InProgress")]
    emulator.held = False
    assert emulator.calls("UpdateClusterVersion") == 2 and first.request_id == "r-0"
    emulator.inject("UpdateClusterVersion", fault, count=5)
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.retryable
    assert fault in str(err.value) and "Rate exceeded" not in str(err.value)
    assert emulator.cluster(REGION, "c1")["updates"] == []
    op = client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
    assert wait_terminal(client, op.id).state == 3  # SUCCEEDED
    assert len(emulator.cluster(REGION, "c1")["updates"]) == 1


def test_botocore_retries_a_transient_error_within_one_call(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(max_attempts=3).client
    emulator.inject("DescribeCluster", "ThrottlingException", count=1)
    assert client.get_cluster(cluster_id("c2")).control_plane_version == OLD
    assert emulator.calls("DescribeCluster") == 2


def test_a_cluster_eks_does_not_know_is_not_found(start_plugin: StartPlugin) -> None:
    client = start_plugin().client
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("r-1", cluster_id("gone"), NEW)
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.reason == "CLUSTER_NOT_FOUND"
    with pytest.raises(PluginCallError) as err:
        client.upgrade_node_pool("r-2", cluster_id("c1"), "gone", OLD)
    assert err.value.reason == "NODE_POOL_NOT_FOUND"


@pytest.mark.parametrize(
    ("operation", "params", "error", "retryable"),
    [
        # EKS's own refusals, asked directly (the plugin's rules would refuse first).
        ("update_cluster_version", {"name": "c1", "version": "1.31"}, FailedPrecondition, False),
        ("update_cluster_version", {"name": "c1", "version": "1.29"}, FailedPrecondition, False),
        ("describe_cluster", {"name": "nope"}, NotFound, False),
        ("describe_update", {"name": "c1", "updateId": "x"}, NotFound, False),
    ],
)
def test_eks_errors_map_to_contract_errors(
    emulator: EksEmulator,
    operation: str,
    params: dict[str, str],
    error: type[PluginError],
    retryable: bool,
) -> None:
    api = EksApi(parse_config(plugin_config(emulator)))
    with pytest.raises(PluginError) as err:
        api.call(REGION, operation, "cluster", **params)
    assert type(err.value) is error and err.value.retryable is retryable
    assert "InvalidParameterException" in err.value.message or error is NotFound
    api.close()


def test_upgrade_readiness_and_state_refusals_of_eks_are_retryable(emulator: EksEmulator) -> None:
    emulator.add_insight(REGION, "c1", NEW, "ERROR", "deprecated APIs", "Deprecated APIs")
    emulator.set_nodegroup_issues(REGION, "c2", "workers", [("NodeCreationFailure", "x")])
    api = EksApi(parse_config(plugin_config(emulator)))
    with pytest.raises(FailedPrecondition) as err:
        api.call(REGION, "update_cluster_version", "cluster", name="c1", version=NEW)
    assert "InvalidStateException" in err.value.message and err.value.retry_after
    with pytest.raises(FailedPrecondition) as err:
        api.call(
            REGION,
            "update_nodegroup_version",
            "node group",
            clusterName="c2",
            nodegroupName="workers",
            version=OLD,
        )
    assert "InvalidRequestException" in err.value.message and err.value.retry_after
    emulator.inject("ListClusters", "ServerException")
    with pytest.raises(Unavailable):
        api.call(REGION, "list_clusters")
    api.close()


def test_credentials_and_eks_words_never_reach_logs_or_answers(
    emulator: EksEmulator, start_plugin: StartPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = start_plugin().client
    emulator.inject("DescribeCluster", "ServerException", count=5)
    with pytest.raises(PluginCallError) as err:
        client.get_cluster(cluster_id("c1"))
    wait_terminal(client, client.upgrade_control_plane("r", cluster_id("c1"), NEW).id)
    assert SECRET not in caplog.text and SECRET not in str(err.value)
    assert "Signature=" not in caplog.text and "Credential=" not in caplog.text
    # EKS's message is logged (redacted), never answered.
    assert "Rate exceeded or service error" in caplog.text
    assert "Rate exceeded or service error" not in str(err.value)
