"""Upgrades through a ManifestWork: the rendered template, status feedback, failure and restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import cluster_pb2
from tests.plugins.ocm.conftest import NEW, OLD, StartPlugin, work_config
from tests.support.kube import KubeCluster
from tests.support.ocm_emulator import WORK, OcmEmulator
from tests.support.upstream import cel_rules

RUNNING, SUCCEEDED, FAILED = (
    cluster_pb2.OPERATION_STATE_RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED,
)


def _works(hub: KubeCluster, cluster: str) -> list[dict[str, Any]]:
    api = hub.api_client()
    try:
        items = k8s.CustomObjectsApi(api).list_namespaced_custom_object(
            WORK[0], WORK[1], cluster, WORK[2]
        )["items"]
        return list(items)
    finally:
        api.close()


def _assert_cel_rules_hold(work: dict[str, Any]) -> None:
    """The upstream ManifestWork CRD's one CEL rule (unknown to the 1.20 test server), checked
    on the work the plugin wrote."""
    [rule] = cel_rules("ocm_manifestworks.yaml")
    assert rule.path == "spec.manifestConfigs[].conditionRules[]"
    assert rule.rule == "self.type != 'CEL' || self.condition != \"\""
    for config in work["spec"].get("manifestConfigs") or []:
        for condition_rule in config.get("conditionRules") or []:
            assert condition_rule.get("type") != "CEL" or condition_rule.get("condition")


def test_the_plan_is_delivered_rendered_and_its_feedback_ends_the_upgrade(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 1.0
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(work_config())
    op = plugin.client.upgrade_control_plane("up-1", name, NEW)
    assert op.state == RUNNING
    [work] = _works(hub, name)
    assert work["metadata"]["name"] == "fleetupgrade-upgrade"
    assert work["metadata"]["annotations"]["fleetupgrade.io/request-id"] == "up-1"
    [plan] = work["spec"]["workload"]["manifests"]
    assert plan["kind"] == "Plan" and plan["spec"]["version"] == f"v{NEW}"
    assert plan["metadata"]["labels"] == {"fleetupgrade.io/cluster": name}
    [config] = work["spec"]["manifestConfigs"]
    _assert_cel_rules_hold(work)
    assert config["resourceIdentifier"]["resource"] == "plans"
    assert [p["name"] for p in config["feedbackRules"][0]["jsonPaths"]] == [
        "complete",
        "reason",
        "message",
        "latestVersion",
    ]
    final = plugin.end(op.id)
    assert final.state == SUCCEEDED
    assert emulator.version_of(name) == NEW
    values = {
        v["name"]: v["fieldValue"]
        for v in _works(hub, name)[0]["status"]["resourceStatus"]["manifests"][0]["statusFeedback"][
            "values"
        ]
    }
    assert values["complete"] == {"type": "String", "string": "True"}
    assert values["latestVersion"] == {"type": "String", "string": f"v{NEW}"}

    # The next upgrade replaces the same ManifestWork; its old Complete=True cannot end it.
    newer = "1.30.0"
    op2 = plugin.client.upgrade_control_plane("up-2", name, newer)
    assert plugin.client.get_operation(op2.id).state == RUNNING
    assert plugin.end(op2.id).state == SUCCEEDED
    assert emulator.version_of(name) == newer
    [work] = _works(hub, name)
    _assert_cel_rules_hold(work)
    assert work["spec"]["workload"]["manifests"][0]["spec"]["version"] == f"v{newer}"
    assert work["metadata"]["generation"] == 2


def test_a_failed_plan_fails_the_operation_with_its_message(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    emulator.fail_next_upgrade_object(
        name, "JobFailed", "Job was active longer than specified deadline"
    )
    plugin = start_plugin(work_config())
    final = plugin.end(plugin.client.upgrade_control_plane("up-1", name, NEW).id)
    assert final.state == FAILED and final.error_code == "UPGRADE_FAILED"
    assert final.error_message == "control-plane: Job was active longer than specified deadline"
    assert emulator.version_of(name) == OLD


def test_an_agent_that_never_applies_the_work_times_out_naming_why(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    emulator.set_available(name, "Unknown", "LeaseExpired", "no lease")  # the agent is gone
    plugin = start_plugin(work_config(monitorTimeout="2s"))
    final = plugin.end(plugin.client.upgrade_control_plane("up-1", name, NEW).id)
    assert final.state == FAILED and final.error_code == "TIMEOUT"
    assert "waiting for the work agent to apply ManifestWork" in final.error_message


def test_a_restarted_plugin_adopts_the_work_and_never_writes_it_twice(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 2.0
    emulator.add_cluster(name, OLD)
    first = start_plugin(work_config())
    op = first.client.upgrade_control_plane("up-1", name, NEW)
    first.client.close()
    first.plugin.stop(grace=0)
    second = start_plugin(work_config())
    assert second.client.get_operation(op.id).state == RUNNING
    assert second.client.upgrade_control_plane("up-1", name, NEW).id == op.id
    assert second.end(op.id).state == SUCCEEDED
    [work] = _works(hub, name)
    assert work["metadata"]["generation"] == 1  # written once
