"""ClusterService over MemberClusters (inventory, taint service-out that placements honour), the
scale mode reading every cluster from one central Prometheus, and the conformance kit."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.kubefleet import collector_names
from plugins.kubefleet.gates import GateRef
from plugins.kubefleet.objects import CLUSTER_APPROVAL_REQUESTS
from plugins.sdk.conformance import run_conformance
from tests.plugins.kubefleet.conftest import MEMBERS, MemberApp, StartPlugin, central_prometheus
from tests.plugins.kubefleet.support import (
    APP,
    APP_NS,
    approval,
    create_tracker,
    health_condition,
    start_cluster_run,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubefleet_emulator import KubeFleetEmulator
from tests.support.orchestrator import free_port
from tests.support.prometheus import prometheus_binary

TAINT = "fleetupgrade.io/out-of-service"


def _taints(emulator: KubeFleetEmulator, name: str) -> list[dict[str, str]]:
    member = emulator.get("MemberCluster", name)
    assert member is not None
    return list((member.get("spec") or {}).get("taints") or [])


def test_member_clusters_are_the_inventory_and_service_out_is_our_taint(
    emulator: KubeFleetEmulator, start_plugin: StartPlugin, names: Callable[[str], str]
) -> None:
    plugin = start_plugin()
    clusters = {c.id: c for c in plugin.client.list_clusters()}
    assert set(MEMBERS) <= set(clusters)
    one = clusters["member-1"]
    assert (one.control_plane_version, one.available, one.in_service) == ("1.29.4", True, True)
    assert one.labels["environment"] == "staging"
    assert [c.id for c in plugin.client.list_clusters({"environment": "prod"})] == [
        "member-2",
        "member-3",
    ]

    # Someone else's taint stays; ours is added (NoSchedule) and removed.
    emulator.patch(
        "MemberCluster",
        "member-3",
        {"spec": {"taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}},
    )
    op = plugin.client.service_out(names("out"), "member-3")
    assert op.kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT
    done = wait_for(
        "service-out done",
        lambda: (
            (o := plugin.client.get_operation(op.id)).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
            and o
        ),
        timeout=30,
    )
    assert done.error_code == ""
    assert _taints(emulator, "member-3") == [
        {"key": "team", "value": "x", "effect": "NoSchedule"},
        {"key": TAINT, "value": "fleet-orchestrator", "effect": "NoSchedule"},
    ]
    assert not plugin.client.get_cluster("member-3").in_service
    # KubeFleet's scheduler honours it: a PickAll placement that tolerates "team" skips member-3.
    crp = names("crp")
    emulator.create(
        "ClusterResourcePlacement",
        {
            "metadata": {"name": crp},
            "spec": {
                "resourceSelectors": [
                    {"group": "", "version": "v1", "kind": "Namespace", "name": "x"}
                ],
                "policy": {
                    "placementType": "PickAll",
                    "tolerations": [{"key": "team", "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        },
    )
    placed = wait_for(
        "the placement status",
        lambda: (
            (emulator.get("ClusterResourcePlacement", crp) or {})
            .get("status", {})
            .get("placementStatuses")
        ),
        timeout=30,
    )
    assert [p["clusterName"] for p in placed] == ["member-1", "member-2"]

    op = plugin.client.service_in(names("in"), "member-3")
    wait_for(
        "service-in done",
        lambda: plugin.client.get_operation(op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED,
        timeout=30,
    )
    assert _taints(emulator, "member-3") == [{"key": "team", "value": "x", "effect": "NoSchedule"}]
    emulator.patch("MemberCluster", "member-3", {"spec": {"taints": None}})
    emulator.delete("ClusterResourcePlacement", crp)


@pytest.mark.slow
def test_scale_mode_reads_every_cluster_from_one_central_prometheus_and_spares_the_hub(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    apps = {name: MemberApp() for name in MEMBERS}
    apps["member-1"].set([1.0, 1.0])
    apps["member-2"].set([1.0, 0.0])
    apps["member-3"].set([1.0], app="other-app")
    for app in apps.values():
        app.start()
    emulator.join("member-4", {"environment": "prod"})  # in the fleet, not in Prometheus
    try:
        with central_prometheus(tmp_path, {n: a.target for n, a in apps.items()}) as url:
            plugin = start_plugin(
                health_source="prometheus", central_prometheus_url=url, report_max_age=30.0
            )
            web = health_pb2.Workload(
                namespace=APP_NS, name=APP, kind="Deployment", min_healthy_replicas=2
            )
            clusters = ["member-1", "member-2", "member-3", "member-4"]

            def verdicts() -> list[int]:
                return [r.health for r in plugin.client.check_workloads(clusters, [web])]

            wanted = [
                health_pb2.WORKLOAD_HEALTH_HEALTHY,
                health_pb2.WORKLOAD_HEALTH_UNHEALTHY,
                health_pb2.WORKLOAD_HEALTH_MISSING,
                health_pb2.WORKLOAD_HEALTH_UNKNOWN,
            ]
            wait_for("all clusters scraped", lambda: verdicts() == wanted, timeout=60)
            before = plugin.plugin.hub.kube.requests()
            for _ in range(5):
                results = plugin.client.check_workloads(clusters, [web])
            assert plugin.plugin.hub.kube.requests() == before, "checks must not touch the hub"
            assert results[1].message == "1 of 2 pod(s) healthy, 2 required"
            assert "no workload_health from cluster='member-4'" in results[3].message

            # Gates in scale mode propagate nothing to the members.
            run = names("scale")
            create_tracker(hub, run)
            start_cluster_run(emulator, run, "staging", "prod")
            # Healthy once a sample newer than member-1's update is in (the run's status first
            # says the stage is updating, then that no sample since the update is in yet).
            cond = wait_for(
                "the staging condition healthy",
                lambda: (
                    (c := health_condition(approval(emulator, run, "staging")))
                    and c["reason"] == "AllWorkloadsHealthy"
                    and c
                ),
                timeout=30,
            )
            assert cond["status"] == "True" and "after-stage" in cond["message"], cond
            mc = collector_names(
                GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-staging", run, "staging")
            )[0]
            assert emulator.get("ClusterResourcePlacement", f"crp-{mc}") is None
    finally:
        for app in apps.values():
            app.stop()
        emulator.leave("member-4")


def test_the_conformance_kit_passes_against_the_plugin(
    emulator: KubeFleetEmulator, start_plugin: StartPlugin, tmp_path: Path
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    running = [start_plugin(listen=listen)]

    def restart() -> None:  # the durability checks restart the plugin on the same endpoint
        running[-1].plugin.stop(grace=0)
        running.append(start_plugin(listen=listen))

    plugin = running[0]
    report = tmp_path / "kit.xml"
    code = run_conformance(
        plugin.address,
        timeout=30.0,
        pytest_args=["-q", f"--junitxml={report}"],
        restart=restart,
    )
    cases = list(ET.parse(report).getroot().iter("testcase"))
    failed = [
        c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None
    ]
    passed = [c.get("name") for c in cases if not list(c)]
    assert code == 0, failed
    assert any("resolve_gate" in (n or "") for n in passed)
    assert any("check_workloads" in (n or "") for n in passed)
    assert any("survive_a_restart" in (n or "") for n in passed)
    assert len(running) >= 2, "the durability check restarted the plugin"
    client = running[-1].client
    assert client.get_cluster("member-1").in_service, "the kit left member-1 as it found it"


def test_a_member_whose_agent_went_silent_is_down_for_the_floor(
    emulator: KubeFleetEmulator, start_plugin: StartPlugin
) -> None:
    """A dead member agent leaves its MemberCluster's conditions True (no hub controller
    changes them); only the age of its last heartbeat says so, and the plugin reads it as
    KubeFleet's scheduler does: the member is not available, so the orchestrator's floor
    (requiredAvailableCount) and the before-stage check count it as down."""
    plugin = start_plugin()
    assert plugin.client.get_cluster("member-2").available

    emulator.go_silent("member-2", seconds_ago=3 * 3600)
    member = emulator.get("MemberCluster", "member-2")
    assert member is not None
    agent = member["status"]["agentStatus"][0]
    assert {c["type"]: c["status"] for c in agent["conditions"]} == {
        "Joined": "True",
        "Healthy": "True",
    }
    down = wait_for(
        "member-2 reported unavailable",
        lambda: (c := plugin.client.get_cluster("member-2")).available is False and c,
        timeout=30,
    )
    assert down.unavailable_reason.startswith("MemberAgent is silent: last heartbeat 3h0m ago (")
    assert "more than the 300s KubeFleet allows" in down.unavailable_reason
    listed = {c.id: c.available for c in plugin.client.list_clusters()}
    assert (listed["member-1"], listed["member-2"], listed["member-3"]) == (True, False, True)

    # The agent speaks again: available again.
    emulator.heartbeat("member-2", "1.29.4")
    wait_for(
        "member-2 available again",
        lambda: plugin.client.get_cluster("member-2").available,
        timeout=30,
    )


def test_a_member_goes_down_once_its_silence_outlasts_the_configured_threshold(
    emulator: KubeFleetEmulator, start_plugin: StartPlugin
) -> None:
    """--heartbeat-timeout: with 3 s, a member silent from now on is available at first and
    unavailable once 3 s have passed without a heartbeat (no write on the hub in between)."""
    plugin = start_plugin(heartbeat_timeout=3.0)
    emulator.go_silent("member-1")
    assert plugin.client.get_cluster("member-1").available
    down = wait_for(
        "member-1 reported unavailable",
        lambda: (c := plugin.client.get_cluster("member-1")).available is False and c,
        timeout=30,
    )
    assert "more than the 3s KubeFleet allows" in down.unavailable_reason
    emulator.heartbeat("member-1", "1.29.4")
