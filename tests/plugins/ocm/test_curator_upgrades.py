"""Upgrades through a ClusterCurator: progress, failure, timeout, restart and conflicts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.ocm.conftest import NEW, OLD, StartPlugin, curator_config
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import CURATOR, OcmEmulator

RUNNING, SUCCEEDED, FAILED = (
    cluster_pb2.OPERATION_STATE_RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED,
)


def _curator(hub: KubeCluster, cluster: str) -> dict[str, Any]:
    api = hub.api_client()
    try:
        return dict(
            k8s.CustomObjectsApi(api).get_namespaced_custom_object(
                CURATOR[0], CURATOR[1], cluster, CURATOR[2], cluster
            )
        )
    finally:
        api.close()


def test_curated_upgrade_reports_progress_and_ends_when_the_hub_sees_the_version(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 1.2
    emulator.version_lag = 1.0  # the registration agent reports the new version a second late
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(curator_config(clusterCurator={"channel": "stable"}))
    updates: list[cluster_pb2.Operation] = []
    watch = plugin.client.watch_operations([name])
    reader = threading.Thread(target=lambda: updates.extend(watch), daemon=True)
    reader.start()
    wait_for("watch registered", lambda: True)  # registration is synchronous on the server
    op = plugin.client.upgrade_control_plane("up-1", name, NEW)
    assert op.state == RUNNING and op.target_version == NEW
    final = plugin.end(op.id)
    watch.cancel()
    reader.join(timeout=5)
    assert final.state == SUCCEEDED and final.progress_percent == 100
    assert emulator.version_of(name) == NEW  # SUCCEEDED only once the hub reports it
    assert plugin.client.get_cluster(name).control_plane_version == NEW
    progress = [u.progress_percent for u in updates if u.id == op.id and u.state == RUNNING]
    assert progress == sorted(progress) and len(set(progress)) >= 3, progress
    assert 95 in progress  # the curation finished while the hub still showed the old version
    spec = _curator(hub, name)["spec"]
    assert spec["desiredCuration"] == "upgrade"
    assert spec["upgrade"] == {"desiredUpdate": NEW, "monitorTimeout": 1, "channel": "stable"}
    assert plugin.client.upgrade_control_plane("up-1", name, NEW).id == op.id
    assert emulator.curations_started == {name: 1}


def test_an_openshift_upgrade_compares_openshift_versions_as_ocm_reports_them(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    """On OpenShift the registration agent reports the Kubernetes version in
    status.version.kubernetes (v1.27.x+<commit>) and the OpenShift version in the
    version.openshift.io claim; the curator's desiredUpdate is the OpenShift one. With the
    shipped configuration (no versionSource: the ClusterCurator default) the plugin reports and
    compares OpenShift versions, and a curated 4.14.10 -> 4.15.2 upgrade SUCCEEDS."""
    [name] = names(1)
    emulator.add_cluster(name, "4.14.10")
    emulator.set_offered(name, ("4.14.10", "4.15.2"))
    assert emulator.kubernetes_version_of(name) == "v1.27.0+b49f9d1"
    plugin = start_plugin(curator_config())
    assert plugin.client.get_cluster(name).control_plane_version == "4.14.10"
    final = plugin.end(plugin.client.upgrade_control_plane("up-ocp", name, "4.15.2").id)
    assert (final.state, final.error_message) == (SUCCEEDED, "")
    assert _curator(hub, name)["spec"]["upgrade"]["desiredUpdate"] == "4.15.2"
    assert emulator.version_of(name) == "4.15.2"
    assert emulator.kubernetes_version_of(name) == "v1.28.2+b49f9d1"
    assert plugin.client.get_cluster(name).control_plane_version == "4.15.2"


def test_without_the_claim_the_openshift_version_comes_from_the_managed_cluster_info(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    """Issue 20 item 3: a registration agent with its ClusterClaim feature gate off exposes no
    claims, so the ManagedCluster has no version.openshift.io claim; ACM's foundation agent
    still reports the OpenShift version in the ManagedClusterInfo
    (status.distributionInfo.ocp.version). The plugin reports and compares that version, and a
    curated 4.14.10 -> 4.15.2 upgrade SUCCEEDS once the ManagedClusterInfo shows 4.15.2 (without
    the fallback the cluster has no version and the upgrade could only time out)."""
    [name] = names(1)
    emulator.add_cluster(name, "4.14.10", cluster_claims=False)
    emulator.set_offered(name, ("4.14.10", "4.15.2"))
    assert emulator.version_of(name) == ""  # no claim on the ManagedCluster
    assert emulator.cluster_info_version(name) == "4.14.10"
    plugin = start_plugin(curator_config())
    assert plugin.client.get_cluster(name).control_plane_version == "4.14.10"
    final = plugin.end(plugin.client.upgrade_control_plane("up-info", name, "4.15.2").id)
    assert (final.state, final.error_message) == (SUCCEEDED, "")
    assert _curator(hub, name)["spec"]["upgrade"]["desiredUpdate"] == "4.15.2"
    assert emulator.cluster_info_version(name) == "4.15.2"
    assert plugin.client.get_cluster(name).control_plane_version == "4.15.2"


def test_the_claim_wins_over_a_managed_cluster_info_that_lags_it(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    """With both, the version.openshift.io claim is the version: the ManagedClusterInfo's
    ocp.version is a copy of that claim made by a separate periodic sync (and deprecated in its
    favour upstream), so where they differ it is the copy that lags."""
    [name] = names(1)
    emulator.add_cluster(name, "4.15.2")
    emulator.write_cluster_info(name, "4.14.10")  # the foundation agent has not synced yet
    assert emulator.cluster_info_version(name) == "4.14.10"
    plugin = start_plugin(curator_config())
    assert plugin.client.get_cluster(name).control_plane_version == "4.15.2"
    done = plugin.client.upgrade_control_plane("up-same", name, "4.15.2")
    assert done.state == SUCCEEDED  # at the version already: nothing is curated
    assert name not in emulator.curations_started


def test_a_failed_curation_fails_the_operation_with_the_curator_message(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    emulator.fail_next_curation(name, "Timed out waiting for monitor upgrade job")
    plugin = start_plugin(curator_config())
    final = plugin.end(plugin.client.upgrade_control_plane("up-1", name, NEW).id)
    assert final.state == FAILED and final.error_code == "CURATION_FAILED"
    assert final.error_message == (
        f"ClusterCurator {name}: curation step monitor-upgrade failed: "
        "Timed out waiting for monitor upgrade job"
    )
    assert plugin.client.get_cluster(name).control_plane_version == OLD
    # A new request after the failure starts a new curation (the curator is free again).
    retry = plugin.end(plugin.client.upgrade_control_plane("up-2", name, NEW).id)
    assert retry.state == SUCCEEDED
    assert emulator.curations_started == {name: 2}


def test_an_upgrade_past_monitor_timeout_fails(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 60
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(curator_config(monitorTimeout="2s"))
    op = plugin.client.upgrade_control_plane("up-1", name, NEW)
    final = plugin.end(op.id, timeout=10)
    assert final.state == FAILED and final.error_code == "TIMEOUT"
    assert final.error_message.startswith("no result within monitorTimeout (2 s); last state: ")
    assert "Upgrade status" in final.error_message or "DesiredCuration" in final.error_message
    assert (final.end_time.ToDatetime() - final.start_time.ToDatetime()).total_seconds() >= 2


def test_a_new_request_during_an_upgrade_is_aborted_naming_the_operation(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 3
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(curator_config())
    op = plugin.client.upgrade_control_plane("up-1", name, NEW)
    for call in (
        lambda: plugin.client.service_out("out-1", name),
        lambda: plugin.client.upgrade_control_plane("up-2", name, NEW),
    ):
        with pytest.raises(PluginCallError) as err:
            call()
        assert err.value.code is grpc.StatusCode.ABORTED and op.id in err.value.message
    assert plugin.client.get_cluster(name).current_operation.id == op.id
    with pytest.raises(PluginCallError) as err:
        plugin.client.upgrade_control_plane("up-1", name, "1.30.0")  # same id, other request
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert plugin.end(op.id).state == SUCCEEDED


def test_user_hooks_on_the_curator_are_kept_and_a_running_curation_is_refused(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    hooked, busy = names(2)
    emulator.add_cluster(hooked, OLD)
    emulator.add_cluster(busy, OLD)
    api = hub.api_client()
    custom = k8s.CustomObjectsApi(api)
    hooks = {
        "towerAuthSecret": "toweraccess",
        "prehook": [{"name": "drain-traffic", "extra_vars": {"region": "eu"}}],
        "posthook": [{"name": "smoke-test"}],
    }
    for cluster, spec in (
        (hooked, {"upgrade": hooks}),
        (busy, {"desiredCuration": "install", "curatorJob": "curator-job-install1"}),
    ):
        custom.create_namespaced_custom_object(
            CURATOR[0],
            CURATOR[1],
            cluster,
            CURATOR[2],
            {
                "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                "kind": "ClusterCurator",
                "metadata": {"name": cluster, "namespace": cluster},
                "spec": spec,
            },
        )
    api.close()
    plugin = start_plugin(curator_config())
    with pytest.raises(PluginCallError) as err:
        plugin.client.upgrade_control_plane("up-busy", busy, NEW)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "curator-job-install1" in err.value.message
    assert _curator(hub, busy)["spec"]["desiredCuration"] == "install"  # untouched
    assert not plugin.client.get_cluster(busy).HasField("current_operation")

    final = plugin.end(plugin.client.upgrade_control_plane("up-hooked", hooked, NEW).id)
    assert final.state == SUCCEEDED
    upgrade = _curator(hub, hooked)["spec"]["upgrade"]
    # The upstream schema defaults each hook's type to Job.
    defaulted = {
        "towerAuthSecret": "toweraccess",
        "prehook": [{"name": "drain-traffic", "extra_vars": {"region": "eu"}, "type": "Job"}],
        "posthook": [{"name": "smoke-test", "type": "Job"}],
    }
    assert {k: upgrade[k] for k in hooks} == defaulted
    assert upgrade["desiredUpdate"] == NEW


def test_nothing_to_do_succeeds_at_once_and_a_downgrade_is_refused(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    name, k3s = names(2)
    emulator.add_cluster(name, NEW)
    emulator.add_cluster(k3s, f"{NEW}+k3s1")  # a distribution's build of the same release
    plugin = start_plugin(curator_config())
    same = plugin.client.upgrade_control_plane("same", name, NEW)
    assert same.state == SUCCEEDED and same.HasField("end_time")
    assert plugin.client.upgrade_control_plane("same-k3s", k3s, NEW).state == SUCCEEDED
    with pytest.raises(PluginCallError) as err:
        plugin.client.upgrade_control_plane("down", name, OLD)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.message.startswith("version: ") and "never downgrade" in err.value.message
    assert emulator.curations_started == {}


def test_a_restarted_plugin_adopts_the_upgrade_and_never_starts_a_second_curation(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 2.5
    emulator.add_cluster(name, OLD)
    first = start_plugin(curator_config())
    op = first.client.upgrade_control_plane("up-1", name, NEW)
    wait_for(
        "the curation runs",
        lambda: first.client.get_operation(op.id).progress_percent >= 25,
        timeout=10,
    )
    first.client.close()
    first.plugin.stop(grace=0)

    second = start_plugin(curator_config())
    adopted = second.client.get_operation(op.id)
    assert adopted.state == RUNNING and adopted.request_id == "up-1"
    assert adopted.target_version == NEW and adopted.kind == op.kind
    assert second.client.get_cluster(name).current_operation.id == op.id
    assert second.client.upgrade_control_plane("up-1", name, NEW).id == op.id
    assert second.end(op.id).state == SUCCEEDED
    assert emulator.curations_started == {name: 1}

    third = start_plugin(curator_config())  # after the end: still answers for the operation
    assert third.client.get_operation(op.id).state == SUCCEEDED
