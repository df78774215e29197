"""Conformance of PreflightUpgrade: a verdict for every target, refusals with a reason, and
never a change to the cluster."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginClient, supports
from plugins.sdk.conformance.suite._kit import (
    UNKNOWN_ID,
    WATCH_SETTLE_SECONDS,
    OperationRecorder,
    expect_error,
    require_rpc,
    wait_terminal,
)
from plugins.sdk.conformance.target import ConformanceTarget

_Verdict = cluster_pb2.PreflightVerdict
_REFUSED = frozenset(
    {cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER, cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER}
)
IMPOSSIBLE_VERSION = "0.1.0"
"""A control-plane target no provider accepts for a Kubernetes cluster (a downgrade to 0.1)."""


@pytest.fixture(autouse=True)
def _needs_preflight(capabilities: frozenset[int]) -> None:
    require_rpc(capabilities, "PreflightUpgrade")


@pytest.fixture
def idle(
    client: PluginClient, cluster: cluster_pb2.Cluster, target: ConformanceTarget
) -> cluster_pb2.Cluster:
    """The test cluster once no operation runs on it (a busy cluster is REFUSED_LATER)."""
    if cluster.HasField("current_operation"):
        wait_terminal(client, cluster.current_operation.id, target.timeout)
        return client.get_cluster(cluster.id)
    return cluster


def _check_shape(answer: cluster_pb2.PreflightUpgradeResponse, what: str) -> None:
    assert answer.verdict != cluster_pb2.PREFLIGHT_VERDICT_UNSPECIFIED, (
        f"{what}: verdict UNSPECIFIED; answer ACCEPTED, REFUSED_LATER or REFUSED_NEVER"
    )
    if answer.verdict in _REFUSED:
        assert answer.reason_code, f"{what}: {_Verdict.Name(answer.verdict)} without reason_code"
        assert answer.message, f"{what}: {_Verdict.Name(answer.verdict)} without a message"
    if answer.verdict != cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER:
        assert answer.retry_after_seconds == 0, (
            f"{what}: retry_after_seconds {answer.retry_after_seconds} with "
            f"{_Verdict.Name(answer.verdict)}; it belongs to REFUSED_LATER only"
        )


def test_the_current_versions_are_accepted(client: PluginClient, idle: cluster_pb2.Cluster) -> None:
    pools = {p.name: p.version for p in idle.node_pools}
    answer = client.preflight_upgrade(idle.id, idle.control_plane_version, pools)
    _check_shape(answer, f"PreflightUpgrade({idle.id}, its current versions)")
    assert answer.verdict == cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED, (
        f"an upgrade of idle cluster {idle.id} to the versions it runs has nothing to do, so "
        f"it would be accepted; got {_Verdict.Name(answer.verdict)} "
        f"{answer.reason_code}: {answer.message}"
    )


def test_node_pools_alone_are_judged_against_the_control_plane_it_has(
    client: PluginClient, idle: cluster_pb2.Cluster
) -> None:
    """An empty control_plane_version asks about the pools only (the caller sends it when the
    control plane is at or past the target, e.g. a release channel moved it): a verdict, not
    INVALID_ARGUMENT, and pools at the versions they run have nothing to do."""
    pools = {p.name: p.version for p in idle.node_pools}
    if not pools:
        pytest.skip(f"cluster {idle.id} reports no node pools")
    answer = client.preflight_upgrade(idle.id, "", pools)
    _check_shape(answer, f"PreflightUpgrade({idle.id}, node pools only)")
    assert answer.verdict == cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED, (
        f"node pools of idle cluster {idle.id} at the versions they run, with no control-plane "
        f"target, have nothing to do, so it would be accepted; got "
        f"{_Verdict.Name(answer.verdict)} {answer.reason_code}: {answer.message}"
    )


def test_an_impossible_target_is_refused_with_a_reason(
    client: PluginClient, idle: cluster_pb2.Cluster
) -> None:
    answer = client.preflight_upgrade(idle.id, IMPOSSIBLE_VERSION)
    _check_shape(answer, f"PreflightUpgrade({idle.id}, {IMPOSSIBLE_VERSION})")
    assert answer.verdict == cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER, (
        f"a control plane at {idle.control_plane_version} cannot go to {IMPOSSIBLE_VERSION}; "
        f"expected REFUSED_NEVER, got {_Verdict.Name(answer.verdict)}"
    )


def test_preflight_changes_nothing(
    client: PluginClient,
    capabilities: frozenset[int],
    idle: cluster_pb2.Cluster,
) -> None:
    recorder = (
        OperationRecorder(client, [idle.id]) if supports(capabilities, "WatchOperations") else None
    )
    try:
        pools = {p.name: p.version for p in idle.node_pools}
        client.preflight_upgrade(idle.id, idle.control_plane_version, pools)
        client.preflight_upgrade(idle.id, IMPOSSIBLE_VERSION)
        if pools:
            client.preflight_upgrade(idle.id, "", pools)
        if recorder is not None:
            started = recorder.collect(WATCH_SETTLE_SECONDS)
            assert started == [], (
                f"PreflightUpgrade started operations {sorted({op.id for op in started})}"
            )
    finally:
        if recorder is not None:
            recorder.close()
    after = client.get_cluster(idle.id)
    assert not after.HasField("current_operation"), (
        f"PreflightUpgrade left operation {after.current_operation.id} on {idle.id}"
    )
    assert after.control_plane_version == idle.control_plane_version
    assert [(p.name, p.version) for p in after.node_pools] == [
        (p.name, p.version) for p in idle.node_pools
    ]
    assert after.in_service == idle.in_service


def test_preflight_of_an_unknown_cluster_is_not_found(
    client: PluginClient, cluster: cluster_pb2.Cluster
) -> None:
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: client.preflight_upgrade(UNKNOWN_ID, cluster.control_plane_version),
        f"PreflightUpgrade(cluster_id={UNKNOWN_ID!r})",
    )


@pytest.mark.parametrize("field", ["cluster_id", "control_plane_version"])
def test_preflight_without_a_required_field_is_invalid_argument_naming_it(
    client: PluginClient, cluster: cluster_pb2.Cluster, field: str
) -> None:
    cluster_id = "" if field == "cluster_id" else cluster.id
    version = "" if field == "control_plane_version" else cluster.control_plane_version
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.preflight_upgrade(cluster_id, version),
        f"PreflightUpgrade({field}='')",
        names=field,
    )
