"""PreflightUpgrade: what UpgradeControlPlane would meet now, answered without writing anything."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.ocm.conftest import (
    NEW,
    OLD,
    StartPlugin,
    curator_config,
    work_config,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import CURATOR, OcmEmulator

ACCEPTED, LATER, NEVER = (
    cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED,
    cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER,
    cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER,
)
SUCCEEDED, FAILED = cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED


def test_preflight_foretells_what_the_curator_would_do(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    offered, withheld, down, bare = names(4)
    for name in (offered, withheld, down, bare):
        emulator.add_cluster(name, OLD)
    emulator.set_offered(withheld, ("1.30.0",))  # the update service does not offer NEW
    emulator.set_available(down, "Unknown", "LeaseExpired", "no lease for 5 minutes")
    emulator.remove_cluster_info(bare)
    emulator.upgrade_seconds = 2.0
    plugin = start_plugin(curator_config())
    assert identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE in plugin.client.capabilities()

    ok = plugin.client.preflight_upgrade(offered, NEW)
    assert ok.verdict == ACCEPTED and not ok.reason_code
    no = plugin.client.preflight_upgrade(withheld, NEW)
    assert (no.verdict, no.reason_code) == (NEVER, "VERSION_NOT_OFFERED")
    assert no.message == f"cluster {withheld} is not offered {NEW} (availableUpdates: 1.30.0)"
    # ... and the curation would indeed fail on it (the job's version validation).
    failed = plugin.end(plugin.client.upgrade_control_plane("up-withheld", withheld, NEW).id)
    assert failed.state == FAILED and "Provided version is not valid" in failed.error_message
    later = plugin.client.preflight_upgrade(down, NEW)
    assert (later.verdict, later.reason_code) == (LATER, "CLUSTER_UNAVAILABLE")
    assert "LeaseExpired" in later.message
    missing = plugin.client.preflight_upgrade(bare, NEW)
    assert (missing.verdict, missing.reason_code) == (LATER, "CLUSTER_INFO_MISSING")

    down_grade = plugin.client.preflight_upgrade(offered, "1.27.0")
    assert (down_grade.verdict, down_grade.reason_code) == (NEVER, "DOWNGRADE_NOT_SUPPORTED")
    pools = plugin.client.preflight_upgrade(offered, NEW, {"workers": NEW})
    assert (pools.verdict, pools.reason_code) == (NEVER, "NODE_POOLS_NOT_SUPPORTED")
    assert plugin.client.preflight_upgrade(offered, OLD).verdict == ACCEPTED  # nothing to do

    op = plugin.client.upgrade_control_plane("up-offered", offered, NEW)
    busy = plugin.client.preflight_upgrade(offered, NEW)
    assert (busy.verdict, busy.reason_code) == (LATER, "CLUSTER_BUSY") and op.id in busy.message
    assert plugin.end(op.id).state == SUCCEEDED
    assert emulator.curations_started == {withheld: 1, offered: 1}  # preflight started nothing

    for cluster_id, version, code in (
        ("mc-absent", NEW, grpc.StatusCode.NOT_FOUND),
        (offered, "soon", grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(PluginCallError) as err:
            plugin.client.preflight_upgrade(cluster_id, version)
        assert err.value.code is code


def test_preflight_of_the_manifest_work_method_asks_no_update_service(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    emulator.set_offered(name, ("1.30.0",))
    plugin = start_plugin(work_config())
    # The ManifestWork method delivers your manifest: no update service to ask.
    assert plugin.client.preflight_upgrade(name, NEW).verdict == ACCEPTED


def test_a_hosted_cluster_the_curator_would_curate_as_standalone_is_refused(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    """Issue 20: the curator controller takes its hosted path only when a HostedCluster named
    like the ClusterCurator sits in the ClusterCurator's namespace (isHostedCluster). This
    plugin writes ClusterCurator <cluster>/<cluster>: a HostedCluster in another namespace
    (HyperShift's usual `clusters`) is refused, before anything is written; one in namespace
    <cluster> takes the hosted path, and a standalone cluster is unaffected."""
    hosted, beside, standalone = names(3)
    for name in (hosted, beside, standalone):
        emulator.add_cluster(name, OLD)
    emulator.add_hosted_cluster("clusters", hosted)
    emulator.add_hosted_cluster(beside, beside)
    plugin = start_plugin(curator_config())
    refused = plugin.client.preflight_upgrade(hosted, NEW)
    assert (refused.verdict, refused.reason_code) == (NEVER, "HOSTED_CLUSTER_NOT_SUPPORTED")
    assert f"HostedCluster clusters/{hosted}" in refused.message
    with pytest.raises(PluginCallError) as err:
        plugin.client.upgrade_control_plane("up-hosted", hosted, NEW)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert f"ClusterCurator {hosted}/{hosted}" in err.value.message
    assert hosted not in emulator.curations_started  # nothing written for it
    for name in (beside, standalone):
        assert plugin.client.preflight_upgrade(name, NEW).verdict == ACCEPTED, name
    done = plugin.end(plugin.client.upgrade_control_plane("up-standalone", standalone, NEW).id)
    assert done.state == SUCCEEDED, done.error_message


def _hosted_cluster_lists(hub: KubeCluster) -> float:
    """How many LISTs of hostedclusters the hub's apiserver has served (its own counter,
    apiserver_request_total, from /metrics; a watch counts as WATCH)."""
    with hub.api_client() as api:
        request = api.param_serialize(
            "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )
        text = api.call_api(*request).read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'resource="hostedclusters"' in line
            and 'verb="LIST"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_hosted_clusters_are_read_from_a_watch_cache_not_listed_per_call(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    """Issue 20: hosted detection used to LIST every HostedCluster on the hub for each
    PreflightUpgrade and UpgradeControlPlane. It reads a list+watch cache now: repeated
    preflights make no LIST (the hub's own request counter), and a HostedCluster created or
    deleted after the plugin started is seen through the watch."""
    hosted, decoy = names(2)
    emulator.add_cluster(hosted, OLD)
    emulator.add_hosted_cluster("clusters", decoy)  # HyperShift is installed on this hub
    plugin = start_plugin(curator_config())
    before = _hosted_cluster_lists(hub)
    for _ in range(5):
        assert plugin.client.preflight_upgrade(hosted, NEW).verdict == ACCEPTED
    assert _hosted_cluster_lists(hub) == before
    emulator.add_hosted_cluster("clusters", hosted)  # (its CRD install checks with a LIST)
    before = _hosted_cluster_lists(hub)
    refused = wait_for(
        "the new HostedCluster seen",
        lambda: (r := plugin.client.preflight_upgrade(hosted, NEW)).verdict == NEVER and r,
    )
    assert refused.reason_code == "HOSTED_CLUSTER_NOT_SUPPORTED"
    emulator.remove_hosted_cluster("clusters", hosted)
    wait_for(
        "the deletion seen",
        lambda: plugin.client.preflight_upgrade(hosted, NEW).verdict == ACCEPTED,
    )
    assert _hosted_cluster_lists(hub) == before


def _curator_at(hub: KubeCluster, namespace: str, name: str) -> dict[str, object] | None:
    with hub.api_client() as api:
        try:
            return dict(
                k8s.CustomObjectsApi(api).get_namespaced_custom_object(
                    CURATOR[0], CURATOR[1], namespace, CURATOR[2], name
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def test_with_hosted_cluster_namespace_a_hosted_cluster_takes_the_curators_hosted_path(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    """Issue 20 item 4, opted in (clusterCurator.hostedClusters: HostedClusterNamespace): the
    ClusterCurator of a hosted cluster goes into its HostedCluster's namespace, named after the
    cluster, where the curator controller's isHostedCluster finds the HostedCluster and its
    job patches the HostedCluster's release image; the upgrade SUCCEEDS, also across a plugin
    restart in the middle, and nothing is written at <cluster>/<cluster>. A standalone
    cluster of the same run keeps <cluster>/<cluster>; a name with HostedClusters in two
    namespaces is refused as ambiguous."""
    hosted, standalone, twice = names(3)
    for name in (hosted, standalone, twice):
        emulator.add_cluster(name, OLD)
    emulator.add_hosted_cluster("clusters", hosted)
    emulator.add_hosted_cluster("clusters", twice)
    emulator.add_hosted_cluster("clusters-old", twice)
    emulator.upgrade_seconds = 2.0
    config = curator_config(clusterCurator={"hostedClusters": "HostedClusterNamespace"})
    first = start_plugin(config)
    assert first.client.preflight_upgrade(hosted, NEW).verdict == ACCEPTED
    op = first.client.upgrade_control_plane("up-hosted", hosted, NEW)
    first.client.close()
    first.plugin.stop(grace=0)  # restarted while the hosted curation runs
    plugin = start_plugin(config)
    final = plugin.end(op.id)
    assert (final.state, final.error_message) == (SUCCEEDED, "")
    curator = _curator_at(hub, "clusters", hosted)
    assert curator is not None
    assert curator["spec"] == {  # type: ignore[comparison-overlap]
        "desiredCuration": "upgrade",
        "upgrade": {"desiredUpdate": NEW, "monitorTimeout": 1},
    }
    assert _curator_at(hub, hosted, hosted) is None
    image = emulator.hosted_cluster("clusters", hosted)["spec"]["release"]["image"]
    assert image == f"quay.io/openshift-release-dev/ocp-release:{NEW}-multi"
    assert emulator.curations_started[hosted] == 1
    assert plugin.client.get_cluster(hosted).control_plane_version == NEW
    done = plugin.end(plugin.client.upgrade_control_plane("up-alone", standalone, NEW).id)
    assert done.state == SUCCEEDED, done.error_message
    assert _curator_at(hub, standalone, standalone) is not None
    ambiguous = plugin.client.preflight_upgrade(twice, NEW)
    assert (ambiguous.verdict, ambiguous.reason_code) == (NEVER, "HOSTED_CLUSTER_AMBIGUOUS")
    assert f"clusters/{twice}" in ambiguous.message
    assert f"clusters-old/{twice}" in ambiguous.message
    with pytest.raises(PluginCallError) as err:
        plugin.client.upgrade_control_plane("up-twice", twice, NEW)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert twice not in emulator.curations_started
    assert _curator_at(hub, "clusters", twice) is None
