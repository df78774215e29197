"""CheckWorkloads from the status feedback of a read-only ManifestWork per cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import health_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.ocm.conftest import OLD, RunningPlugin, StartPlugin, curator_config
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import WORK, OcmEmulator

H = health_pb2
WEB = H.Workload(namespace="shop", name="web", kind="Deployment", min_healthy_replicas=2)
API = H.Workload(namespace="shop", name="api")
GONE = H.Workload(namespace="shop", name="retired")


def _verdicts(
    plugin: RunningPlugin, clusters: list[str], workloads: list[health_pb2.Workload]
) -> dict[tuple[str, str], health_pb2.WorkloadResult]:
    results = plugin.client.check_workloads(clusters, workloads)
    assert [(r.cluster_id, r.workload.name) for r in results] == [
        (c, w.name) for c in clusters for w in workloads
    ]
    return {(r.cluster_id, r.workload.name): r for r in results}


def _settled(
    plugin: RunningPlugin, clusters: list[str], workloads: list[health_pb2.Workload]
) -> dict[tuple[str, str], health_pb2.WorkloadResult]:
    """Polls until no verdict is UNKNOWN (the work agent has reported every workload)."""

    def known() -> dict[tuple[str, str], health_pb2.WorkloadResult] | None:
        verdicts = _verdicts(plugin, clusters, workloads)
        unknown = [r for r in verdicts.values() if r.health == H.WORKLOAD_HEALTH_UNKNOWN]
        return None if unknown else verdicts

    found: dict[tuple[str, str], health_pb2.WorkloadResult] = wait_for(
        "every workload reported", known, timeout=15, interval=0.2
    )
    return found


@pytest.mark.parametrize("feedback", ["WellKnownStatus", "JSONPaths"])
def test_workload_verdicts_follow_the_deployments_on_the_members(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    feedback: str,
) -> None:
    a, b = names(2)
    for cluster in (a, b):
        emulator.add_cluster(cluster, OLD)
    emulator.set_deployment(a, "shop", "web", available=3, replicas=3)
    emulator.set_deployment(a, "shop", "api", available=1, replicas=1)
    emulator.set_deployment(b, "shop", "web", available=1, replicas=3)  # below the minimum of 2
    plugin = start_plugin(curator_config(workloads={"feedback": feedback}))

    first = _verdicts(plugin, [a, b], [WEB, API, GONE])
    assert {r.health for r in first.values()} == {H.WORKLOAD_HEALTH_UNKNOWN}  # nothing yet
    verdicts = _settled(plugin, [a, b], [WEB, API, GONE])
    assert verdicts[(a, "web")].health == H.WORKLOAD_HEALTH_HEALTHY
    assert verdicts[(a, "web")].healthy_replicas == 3
    assert verdicts[(a, "web")].observed_value == 3.0
    assert verdicts[(a, "web")].HasField("observed_time")
    assert verdicts[(a, "api")].health == H.WORKLOAD_HEALTH_HEALTHY  # min 0 means 1
    assert verdicts[(b, "web")].health == H.WORKLOAD_HEALTH_UNHEALTHY
    assert verdicts[(b, "web")].healthy_replicas == 1
    assert verdicts[(b, "api")].health == H.WORKLOAD_HEALTH_MISSING
    assert verdicts[(a, "retired")].health == H.WORKLOAD_HEALTH_MISSING

    emulator.set_deployment(b, "shop", "web", available=3, replicas=3)
    wait_for(
        "the recovery shows",
        lambda: _verdicts(plugin, [b], [WEB])[(b, "web")].health == H.WORKLOAD_HEALTH_HEALTHY,
        timeout=10,
    )
    api = hub.api_client()
    work = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        WORK[0], WORK[1], a, WORK[2], "fleetupgrade-health"
    )
    api.close()
    configs: list[dict[str, Any]] = work["spec"]["manifestConfigs"]
    assert {c["resourceIdentifier"]["name"] for c in configs} == {"web", "api", "retired"}
    assert all(c["updateStrategy"]["type"] == "ReadOnly" for c in configs)
    assert all(c["feedbackRules"][0]["type"] == feedback for c in configs)

    # Another workload asked about: the same ManifestWork is updated (against the upstream
    # schema), keeping the others.
    db = H.Workload(namespace="shop", name="db")
    _verdicts(plugin, [a], [db])
    api = hub.api_client()
    work = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        WORK[0], WORK[1], a, WORK[2], "fleetupgrade-health"
    )
    api.close()
    names_now = {c["resourceIdentifier"]["name"] for c in work["spec"]["manifestConfigs"]}
    assert names_now == {"web", "api", "retired", "db"} and work["metadata"]["generation"] == 2


def test_feedback_from_a_cluster_whose_agent_is_gone_is_unknown(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    emulator.set_deployment(name, "shop", "web", available=3, replicas=3)
    plugin = start_plugin(curator_config())
    assert _settled(plugin, [name], [WEB])[(name, "web")].health == H.WORKLOAD_HEALTH_HEALTHY
    emulator.set_available(name, "Unknown", "LeaseExpired", "no lease renewal for 5 minutes")
    stale = wait_for(
        "stale feedback is not trusted",
        lambda: (
            (r := _verdicts(plugin, [name], [WEB])[(name, "web")]).health
            == H.WORKLOAD_HEALTH_UNKNOWN
            and r
        ),
        timeout=10,
    )
    assert "stale" in stale.message and "LeaseExpired" in stale.message


def test_only_deployments_can_be_checked(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(curator_config())
    with pytest.raises(PluginCallError) as err:
        plugin.client.check_workloads(
            [name], [API, H.Workload(namespace="shop", name="db", kind="StatefulSet")]
        )
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.message.startswith("workloads[1].kind:")
    with pytest.raises(PluginCallError) as err:
        plugin.client.check_workloads(["no-such-cluster"], [API])
    assert err.value.code is grpc.StatusCode.NOT_FOUND
