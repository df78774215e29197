"""The sim as an adversary: injected error codes with details, answers lost after the work,
hung and forgotten operations, and upgrades made by someone else."""

from __future__ import annotations

import time

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc
from plugins.sdk.client import PluginCallError, error_details, is_retryable
from plugins.sim import parse_fleet
from plugins.sim.config import ConfigError
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import admin_request, small_fleet, wait_until

SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
FAILED = cluster_pb2.OPERATION_STATE_FAILED
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING


def _raw_error(address: str, rpc: str, request: object) -> grpc.RpcError:
    """The error of one call through a bare stub (no retry policy hides anything)."""
    with grpc.insecure_channel(address) as channel:
        method = getattr(cluster_pb2_grpc.ClusterServiceStub(channel), rpc)
        with pytest.raises(grpc.RpcError) as info:
            method(request, timeout=5)
    return info.value


@pytest.mark.parametrize(
    ("rule", "code", "reason", "retryable", "retry_after"),
    [
        ({"code": "UNAVAILABLE"}, grpc.StatusCode.UNAVAILABLE, "PROVIDER_UNAVAILABLE", True, 0.0),
        ({"code": "ABORTED"}, grpc.StatusCode.ABORTED, "OPERATION_IN_FLIGHT", False, None),
        (
            {"code": "FAILED_PRECONDITION", "reason": "CLUSTER_BUSY", "retryAfter": 5},
            grpc.StatusCode.FAILED_PRECONDITION,
            "CLUSTER_BUSY",
            True,
            5.0,
        ),
        (
            {"code": "FAILED_PRECONDITION", "reason": "VERSION_NOT_OFFERED"},
            grpc.StatusCode.FAILED_PRECONDITION,
            "VERSION_NOT_OFFERED",
            False,
            None,
        ),
    ],
    ids=["unavailable", "aborted", "precondition-later", "precondition-never"],
)
def test_rpc_errors_answer_the_code_with_its_details_and_do_nothing(
    start_sim: StartSim,
    rule: dict[str, object],
    code: grpc.StatusCode,
    reason: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    faults = {"rpcErrors": [{"method": "ServiceOut", "times": 1, **rule}]}
    run = start_sim(small_fleet(faults=faults))
    # A bare stub: the SDK client's retry policy would hide a single UNAVAILABLE.
    error = _raw_error(
        run.sim.address,
        "ServiceOut",
        cluster_pb2.ServiceOutRequest(request_id="out-1", cluster_id="c1"),
    )
    assert error.code() is code  # type: ignore[attr-defined]
    details = error_details(error)
    assert (details.reason, details.retry_after) == (reason, retry_after)
    assert (is_retryable("ServiceOut", code) or details.retry_after is not None) is retryable
    assert run.sim.monitor.snapshot()["mutations_total"] == 0
    # times: 1, so the repeat goes through.
    op = run.finish(run.client.service_out("out-1", "c1"))
    assert op.state == SUCCEEDED


def test_a_lost_answer_leaves_the_work_done_and_the_request_id_finds_it(
    start_sim: StartSim,
) -> None:
    faults = {
        "rpcErrors": [
            {"method": "UpgradeControlPlane", "code": "UNAVAILABLE", "after": True, "times": 1}
        ]
    }
    run = start_sim(small_fleet(faults=faults))
    lost = _raw_error(
        run.sim.address,
        "UpgradeControlPlane",
        cluster_pb2.UpgradeControlPlaneRequest(
            request_id="cp-1", cluster_id="c1", version="1.29.4"
        ),
    )
    assert lost.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert "carried out" in (lost.details() or "")  # type: ignore[attr-defined]
    assert run.sim.monitor.snapshot()["mutations_total"] == 1
    again = run.client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    assert run.finish(again).state == SUCCEEDED
    assert run.client.get_cluster("c1").control_plane_version == "1.29.4"
    assert run.sim.monitor.snapshot()["mutations_total"] == 1


def test_a_hung_operation_stays_running_until_ended_through_the_admin_endpoint(
    start_sim: StartSim,
) -> None:
    faults = {"hangStep": [{"step": "controlPlane", "clusters": ["c1"], "times": 1}]}
    run = start_sim(small_fleet(step=0.05, faults=faults))
    op = run.client.upgrade_control_plane("cp-1", "c1", "1.29.4")
    wait_until(lambda: run.client.get_operation(op.id).state == RUNNING, what="RUNNING")
    time.sleep(0.3)  # six step durations: a normal operation would have ended
    assert run.client.get_operation(op.id).state == RUNNING
    busy = run.client.preflight_upgrade("c1", "1.29.4")
    assert (busy.reason_code, busy.retry_after_seconds) == ("CLUSTER_BUSY", 0)
    status, body = admin_request(
        f"{run.admin_url}/operations/{op.id}/finish",
        "POST",
        {"state": "FAILED", "errorCode": "TIMED_OUT", "errorMessage": "gave up"},
    )
    assert (status, body["state"], body["errorCode"]) == (
        200,
        "OPERATION_STATE_FAILED",
        "TIMED_OUT",
    )
    cluster = run.client.get_cluster("c1")
    assert (cluster.control_plane_version, cluster.available) == ("1.28.5", True)
    assert not cluster.HasField("current_operation")
    # times: 1, so the next attempt runs normally.
    assert run.finish(run.client.upgrade_control_plane("cp-2", "c1", "1.29.4")).state == SUCCEEDED


def test_a_forgotten_operation_is_not_found_and_its_request_id_starts_afresh(
    start_sim: StartSim,
) -> None:
    faults = {"forgetStep": [{"step": "serviceOut", "clusters": ["c1"], "times": 1}]}
    run = start_sim(small_fleet(step=0.05, faults=faults))
    op = run.client.service_out("out-1", "c1")

    def _forgotten() -> bool:
        try:
            run.client.get_operation(op.id)
        except PluginCallError as exc:
            return exc.code is grpc.StatusCode.NOT_FOUND
        return False

    wait_until(_forgotten, what="the operation to be forgotten")
    cluster = run.client.get_cluster("c1")
    assert cluster.in_service and not cluster.HasField("current_operation")
    again = run.client.service_out("out-1", "c1")
    assert again.id == op.id  # ids derive from the request_id
    assert run.finish(again).state == SUCCEEDED
    assert not run.client.get_cluster("c1").in_service


def test_the_admin_endpoint_forgets_a_running_operation(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(step=5.0))
    op = run.client.upgrade_control_plane("cp-1", "c2", "1.29.4")
    status, _ = admin_request(f"{run.admin_url}/operations/{op.id}/forget", "POST", {})
    assert status == 200
    with pytest.raises(PluginCallError) as gone:
        run.client.get_operation(op.id)
    assert gone.value.code is grpc.StatusCode.NOT_FOUND
    assert run.client.get_cluster("c2").control_plane_version == "1.28.5"
    assert run.sim.monitor.snapshot()["operations_in_flight"] == 0
    status, body = admin_request(f"{run.admin_url}/operations/{op.id}/forget", "POST", {})
    assert status == 404 and op.id in body["error"]


def test_out_of_band_upgrades_change_versions_without_an_operation(start_sim: StartSim) -> None:
    faults = {
        "outOfBandUpgrades": [
            {
                "clusters": ["c3"],
                "after": 0.1,
                "controlPlaneVersion": "1.30.2",
                "nodePoolVersion": "1.30.2",
            }
        ]
    }
    run = start_sim(small_fleet(faults=faults))
    status, body = admin_request(
        f"{run.admin_url}/clusters/c1/versions",
        "POST",
        {"controlPlaneVersion": "1.29.9", "nodePools": {"p2": "1.29.9"}},
    )
    assert status == 200
    assert body["controlPlaneVersion"] == "1.29.9"
    c1 = run.client.get_cluster("c1")
    assert {p.name: p.version for p in c1.node_pools} == {"p1": "1.28.5", "p2": "1.29.9"}
    wait_until(
        lambda: run.client.get_cluster("c3").control_plane_version == "1.30.2",
        what="the scheduled out-of-band upgrade",
    )
    assert {p.version for p in run.client.get_cluster("c3").node_pools} == {"1.30.2"}
    assert run.sim.monitor.snapshot()["mutations_total"] == 0
    status, body = admin_request(
        f"{run.admin_url}/clusters/c1/versions", "POST", {"nodePools": {"gpu": "1.29.9"}}
    )
    assert status == 404 and "gpu" in body["error"]
    status, body = admin_request(
        f"{run.admin_url}/clusters/c1/versions", "POST", {"controlPlaneVersion": "latest"}
    )
    assert status == 409 and "controlPlaneVersion" in body["error"]


@pytest.mark.parametrize(
    ("faults", "named"),
    [
        ({"rpcErrors": [{"method": "GetCluster", "code": "ABORTED", "after": True}]}, "after"),
        ({"rpcErrors": [{"method": "Nope", "code": "ABORTED"}]}, "rpcErrors[0].method"),
        ({"rpcErrors": [{"method": "GetCluster", "code": "TEAPOT"}]}, "code"),
        ({"hangStep": [{"step": "serviceIn", "clusters": ["zz"]}]}, "faults.hangStep[0].clusters"),
        ({"refuseVersions": [{"versions": ["one"]}]}, "versions[0]"),
    ],
)
def test_bad_adversary_faults_name_the_field(faults: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=r"\S") as bad:
        parse_fleet(small_fleet(faults=faults))
    assert named in str(bad.value)


def test_faults_are_replaced_at_run_time_through_the_admin_endpoint(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    url = f"{run.admin_url}/faults"
    status, _ = admin_request(
        url,
        "PUT",
        {
            "rpcErrors": [{"method": "GetCluster", "code": "NOT_FOUND", "reason": "GONE"}],
            "refuseVersions": [{"versions": ["1.29.4"], "clusters": ["c2"]}],
        },
    )
    assert status == 200
    with pytest.raises(PluginCallError) as gone:
        run.client.get_cluster("c1")
    assert (gone.value.code, gone.value.reason) == (grpc.StatusCode.NOT_FOUND, "GONE")
    refused = run.client.preflight_upgrade("c2", "1.29.4")
    assert refused.reason_code == "VERSION_NOT_OFFERED"
    status, body = admin_request(
        url, "PUT", {"hangStep": [{"step": "serviceIn", "clusters": ["zz"]}]}
    )
    assert status == 422 and "zz" in body["error"]
    status, body = admin_request(url, "PUT", {"rpcErrors": [{"method": "GetCluster"}]})
    assert status == 400 and "rpcErrors.0.code" in body["error"]
    # The refused update left the faults as they were; an empty body clears them.
    with pytest.raises(PluginCallError):
        run.client.get_cluster("c1")
    assert admin_request(url, "PUT", {})[0] == 200
    assert run.client.get_cluster("c1").id == "c1"
    assert run.client.preflight_upgrade("c2", "1.29.4").reason_code == ""
