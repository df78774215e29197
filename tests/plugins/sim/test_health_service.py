"""HealthService of the sim: workload verdicts, templated metric queries, and changing both
while the sim runs (admin endpoint, fleet file reload)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from fleetupgrade.plugin.v1 import health_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import RunningSim, admin_request, small_fleet, wait_until

HEALTHY = health_pb2.WORKLOAD_HEALTH_HEALTHY
UNHEALTHY = health_pb2.WORKLOAD_HEALTH_UNHEALTHY
MISSING = health_pb2.WORKLOAD_HEALTH_MISSING
UNKNOWN = health_pb2.WORKLOAD_HEALTH_UNKNOWN

ERRORS = 'errors{cluster="{{cluster}}",stage="{{stage}}"}'


def _fleet() -> dict[str, Any]:
    fleet = small_fleet(metrics={"fleet_up": 3})
    fleet["defaults"]["workloads"] = [
        {"namespace": "shop", "name": "web", "kind": "Deployment", "healthyReplicas": 3},
        {"namespace": "shop", "name": "db", "kind": "StatefulSet", "healthyReplicas": 1},
    ]
    fleet["defaults"]["metrics"] = {ERRORS: 0.01}
    fleet["clusters"][1]["workloads"] = [
        {"namespace": "shop", "name": "web", "healthyReplicas": 1, "health": 0.5},
        {"namespace": "shop", "name": "db", "kind": "StatefulSet", "health": "unknown"},
    ]
    fleet["clusters"][1]["metrics"] = {"latency_p99": 0.2}
    return fleet


def _workload(name: str, kind: str = "", replicas: int = 0) -> health_pb2.Workload:
    return health_pb2.Workload(
        namespace="shop", name=name, kind=kind, min_healthy_replicas=replicas
    )


_request = admin_request


def test_check_workloads_verdicts(start_sim: StartSim) -> None:
    run = start_sim(_fleet())
    wanted = [
        _workload("web"),
        _workload("web", replicas=4),
        _workload("db", kind="statefulset"),
        _workload("db", kind="Deployment"),
        _workload("cache"),
    ]
    results = run.client.check_workloads(["c2", "c1"], wanted)
    assert [(r.cluster_id, r.workload.name, r.health) for r in results] == [
        ("c2", "web", UNHEALTHY),  # workload_health 0.5 < 1
        ("c2", "web", UNHEALTHY),
        ("c2", "db", UNKNOWN),  # no fresh data
        ("c2", "db", MISSING),  # a StatefulSet, not a Deployment
        ("c2", "cache", MISSING),
        ("c1", "web", HEALTHY),
        ("c1", "web", UNHEALTHY),  # 3 healthy replicas, 4 required
        ("c1", "db", HEALTHY),
        ("c1", "db", MISSING),
        ("c1", "cache", MISSING),
    ]
    first = results[0]
    assert first.observed_value == pytest.approx(0.5) and first.healthy_replicas == 1
    assert first.observed_time.seconds > 0
    assert results[6].message == "3 healthy replicas (need 4), workload_health 1"
    assert results[3].message == "workload shop/db is a StatefulSet, not a Deployment"


@pytest.mark.parametrize(
    ("cluster_ids", "workloads", "message"),
    [
        ([], [_workload("web")], "cluster_ids: must not be empty"),
        (["c1"], [], "workloads: must not be empty"),
        (["c1"], [health_pb2.Workload(name="web")], "workloads[0].namespace: must not be empty"),
    ],
)
def test_check_workloads_rejects_empty_fields(
    start_sim: StartSim, cluster_ids: list[str], workloads: list[Any], message: str
) -> None:
    run = start_sim(_fleet())
    with pytest.raises(PluginCallError) as err:
        run.client.check_workloads(cluster_ids, workloads)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.message.startswith(message)


def test_check_workloads_unknown_cluster_is_not_found(start_sim: StartSim) -> None:
    run = start_sim(_fleet())
    with pytest.raises(PluginCallError) as err:
        run.client.check_workloads(["c1", "nope"], [_workload("web")])
    assert (err.value.code, err.value.message) == (
        grpc.StatusCode.NOT_FOUND,
        "cluster nope not found",
    )


def test_query_metric_fills_placeholders_from_args_and_the_cluster(start_sim: StartSim) -> None:
    run = start_sim(_fleet())
    client = run.client
    # cluster_id given: {{cluster}} and {{stage}} come from the cluster.
    answer = client.query_metric(ERRORS, {}, "c1")
    assert answer.has_data and answer.value == pytest.approx(0.01)
    assert answer.observed_time.seconds > 0
    # The cluster from args, the rendered query as the caller could write it.
    rendered = 'errors{cluster="c3",stage="a"}'
    assert client.query_metric(rendered, {}, "c3").value == pytest.approx(0.01)
    assert client.query_metric(ERRORS, {"cluster": "c3"}).value == pytest.approx(0.01)
    # args win over labels: a stage the cluster does not have renders a query with no data.
    missing = client.query_metric(ERRORS, {"stage": "b"}, "c1")
    assert not missing.has_data
    assert missing.message == ('no data for query \'errors{cluster="c1",stage="b"}\' on cluster c1')
    # A cluster with its own metrics has only those.
    assert client.query_metric("latency_p99", {}, "c2").value == pytest.approx(0.2)
    assert not client.query_metric(ERRORS, {}, "c2").has_data
    # No cluster: the fleet-wide table.
    assert client.query_metric("fleet_up", {}).value == 3
    with pytest.raises(PluginCallError) as err:
        client.query_metric("", {}, "c1")
    assert err.value.message.startswith("query: must not be empty")
    with pytest.raises(PluginCallError) as err:
        client.query_metric("x", {}, "c404")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_admin_endpoint_changes_health_metrics_and_availability(start_sim: StartSim) -> None:
    run = start_sim(_fleet())
    client = run.client
    url = f"{run.admin_url}/clusters/c1/health"
    status, body = _request(
        url,
        "PUT",
        {
            "workloads": [{"namespace": "shop", "name": "web", "healthyReplicas": 0, "health": 0}],
            "metrics": {ERRORS.replace("{{cluster}}", "c1").replace("{{stage}}", "a"): 0.5},
            "available": False,
            "unavailableReason": "maintenance",
        },
    )
    assert status == 200 and body["available"] is False
    [web, db] = client.check_workloads(["c1"], [_workload("web"), _workload("db")])
    assert (web.health, db.health) == (UNHEALTHY, MISSING)
    assert client.query_metric(ERRORS, {}, "c1").value == pytest.approx(0.5)
    cluster = client.get_cluster("c1")
    assert not cluster.available and cluster.unavailable_reason == "maintenance"
    assert run.monitor()["available_in_service"] == 2

    status, _ = _request(url, "PUT", {"metrics": {'errors{cluster="c1",stage="a"}': None}})
    assert status == 200
    assert not client.query_metric(ERRORS, {}, "c1").has_data
    assert _request(url, "PUT", {"available": True})[0] == 200
    assert client.get_cluster("c1").available

    status, _ = _request(f"{run.admin_url}/metrics", "PUT", {"fleet_up": 1})
    assert status == 200 and client.query_metric("fleet_up", {}).value == 1


def test_admin_endpoint_errors_name_the_problem(start_sim: StartSim) -> None:
    run = start_sim(_fleet())
    status, body = _request(f"{run.admin_url}/clusters/zz/health", "PUT", {"available": True})
    assert (status, body) == (404, {"error": "cluster zz not found"})
    status, body = _request(
        f"{run.admin_url}/clusters/c1/health", "PUT", {"workloads": [{"name": "x"}]}
    )
    assert status == 400 and body["error"].startswith("workloads.0.namespace: Field required")
    status, body = _request(f"{run.admin_url}/clusters/c1/health", "PUT", {"colour": 1})
    assert status == 400 and "colour" in body["error"]
    status, body = _request(f"{run.admin_url}/reload", "POST", {})
    assert (status, body) == (409, {"error": "no --fleet file to reload"})
    status, body = _request(f"{run.admin_url}/monitor", "GET")
    assert status == 200 and body["clusters_total"] == 3
    status, body = _request(f"{run.admin_url}/clusters/c2", "GET")
    assert status == 200 and body["metrics"] == {"latency_p99": 0.2}


def _rewrite(run: RunningSim, change: dict[str, Any]) -> None:
    path = run.sim.options.fleet_file
    assert path is not None
    data = yaml.safe_load(Path(path).read_text())
    data.update(change)
    Path(path).write_text(yaml.safe_dump(data))
    # Make the change visible to an mtime check even within one timestamp tick.
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_fleet_file_changes_are_picked_up_while_running(start_sim: StartSim) -> None:
    run = start_sim(_fleet(), write_file=True, reload_interval=0.05)
    client = run.client
    run.finish(client.upgrade_control_plane("cp", "c1", "1.29.4"))
    fleet = _fleet()
    fleet["defaults"]["metrics"] = {ERRORS: 0.9}
    fleet["clusters"].append(
        {"id": "c9", "labels": {"stage": "b"}, "controlPlaneVersion": "1.28.5"}
    )
    _rewrite(run, fleet)
    wait_until(
        lambda: client.query_metric(ERRORS, {}, "c1").value == pytest.approx(0.9),
        what="the new metric value",
    )
    # Simulated state survives the reload; the new cluster is there.
    assert client.get_cluster("c1").control_plane_version == "1.29.4"
    assert client.get_cluster("c9").control_plane_version == "1.28.5"
    run.wait_monitor(lambda m: m["clusters_total"] == 4, "the added cluster counted")


def test_a_broken_fleet_file_keeps_the_running_fleet(start_sim: StartSim) -> None:
    run = start_sim(_fleet(), write_file=True, reload_interval=0)
    _rewrite(run, {"clusters": [{"id": "c1", "controlPlaneVersion": "nope"}]})
    status, body = _request(f"{run.admin_url}/reload", "POST", {})
    assert status == 422
    assert "clusters[0].controlPlaneVersion: 'nope' is not a version" in body["error"]
    assert run.client.query_metric(ERRORS, {}, "c1").value == pytest.approx(0.01)
    fixed = _fleet()
    fixed["defaults"]["metrics"] = {ERRORS: 0.2}
    _rewrite(run, fixed)
    assert _request(f"{run.admin_url}/reload", "POST", {}) == (200, {"reloaded": True})
    assert run.client.query_metric(ERRORS, {}, "c1").value == pytest.approx(0.2)
