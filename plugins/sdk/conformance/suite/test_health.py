"""Conformance of HealthService: request validation and one verdict per cluster and workload."""

from __future__ import annotations

import grpc

from fleetupgrade.plugin.v1 import health_pb2
from plugins.sdk.client import PluginClient
from plugins.sdk.conformance.suite._kit import expect_error, require_rpc

_NO_SUCH = [
    health_pb2.Workload(namespace="conformance-absent", name="no-such-workload-a"),
    health_pb2.Workload(namespace="conformance-absent", name="no-such-workload-b"),
]


def test_check_workloads_without_clusters_is_invalid_argument(
    client: PluginClient, capabilities: frozenset[int]
) -> None:
    require_rpc(capabilities, "CheckWorkloads")
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.check_workloads([], _NO_SUCH),
        "CheckWorkloads(cluster_ids=[])",
        names="cluster_ids",
    )


def test_check_workloads_without_workloads_is_invalid_argument(
    client: PluginClient, capabilities: frozenset[int], cluster_id: str
) -> None:
    require_rpc(capabilities, "CheckWorkloads")
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.check_workloads([cluster_id], []),
        "CheckWorkloads(workloads=[])",
        names="workloads",
    )


def test_check_workloads_answers_each_pair_and_never_calls_absent_ones_healthy(
    client: PluginClient, capabilities: frozenset[int], cluster_id: str
) -> None:
    require_rpc(capabilities, "CheckWorkloads")
    results = client.check_workloads([cluster_id], _NO_SUCH)
    assert [(r.cluster_id, r.workload.name) for r in results] == [
        (cluster_id, w.name) for w in _NO_SUCH
    ], "CheckWorkloads must answer one result per (cluster, workload), in request order"
    for result in results:
        assert result.health not in (
            health_pb2.WORKLOAD_HEALTH_UNSPECIFIED,
            health_pb2.WORKLOAD_HEALTH_HEALTHY,
        ), (
            f"absent workload {result.workload.name} on {cluster_id} answered "
            f"{health_pb2.WorkloadHealth.Name(result.health)}; expected MISSING or UNKNOWN"
        )


def test_query_metric_without_query_is_invalid_argument(
    client: PluginClient, capabilities: frozenset[int]
) -> None:
    require_rpc(capabilities, "QueryMetric")
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.query_metric("", {}),
        "QueryMetric(query='')",
        names="query",
    )
