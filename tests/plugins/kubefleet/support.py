"""Helpers of the KubeFleet tests: the tutorial's objects, and reads of what ended up where."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from plugins.kubefleet import HEALTH_CONDITION
from tests.support.kube import KubeCluster
from tests.support.kubefleet_emulator import KubeFleetEmulator

APP, APP_NS = "sample-metric-app", "test-ns"
METRIC = ("metric.kubernetes-fleet.io", "v1alpha1")
"""The seed tutorial's group (cbpr_* CRDs)."""
AUTOAPPROVE = ("autoapprove.kubernetes-fleet.io", "v1alpha1")
"""The current cookbook's group (cbmain_* CRDs)."""
GROUPS = {"seed": METRIC, "current": AUTOAPPROVE}


def stages(*names: str, before: bool = False) -> dict[str, Any]:
    """A strategy spec: one stage per environment label value, an Approval after each (and
    before each, with before=True)."""
    return {
        "stages": [
            {
                "name": name,
                "labelSelector": {"matchLabels": {"environment": name}},
                "afterStageTasks": [{"type": "Approval"}],
                **({"beforeStageTasks": [{"type": "Approval"}]} if before else {}),
            }
            for name in names
        ]
    }


def tracker_body(
    name: str, healthy_replicas: int = 1, cookbook: str = "current", **extra: Any
) -> dict[str, Any]:
    """A tracker of the generation: current (kind and healthyReplicas, both required there) or
    seed (name and namespace only: its schema has nothing else). Extra checks go in the
    fleetupgrade.io/health-checks annotation (neither schema has a field for them)."""
    workload: dict[str, Any] = {"name": APP, "namespace": APP_NS}
    if cookbook == "current":
        workload.update(kind="Deployment", healthyReplicas=healthy_replicas)
    meta: dict[str, Any] = {"name": name}
    checks = extra.pop("healthChecks", None)
    if checks is not None:
        meta["annotations"] = {"fleetupgrade.io/health-checks": json.dumps(checks)}
    group, version = GROUPS[cookbook]
    return {"apiVersion": f"{group}/{version}", "metadata": meta, "workloads": [workload], **extra}


def create_tracker(
    hub: KubeCluster,
    name: str,
    namespace: str = "",
    healthy_replicas: int = 1,
    cookbook: str = "current",
    **extra: Any,
) -> dict[str, Any]:
    """Creates the tracker; returns it as the hub stored it."""
    body = tracker_body(name, healthy_replicas, cookbook, **extra)
    group = GROUPS[cookbook]
    with hub.api_client() as api:
        custom = k8s.CustomObjectsApi(api)
        if namespace:
            body["kind"] = "StagedWorkloadTracker"
            body["metadata"]["namespace"] = namespace
            return dict(
                custom.create_namespaced_custom_object(
                    *group, namespace, "stagedworkloadtrackers", body
                )
            )
        body["kind"] = "ClusterStagedWorkloadTracker"
        return dict(
            custom.create_cluster_custom_object(*group, "clusterstagedworkloadtrackers", body)
        )


def start_cluster_run(
    emu: KubeFleetEmulator, run: str, *stage_names: str, before: bool = False
) -> None:
    """ClusterStagedUpdateStrategy + PickAll ClusterResourcePlacement + ClusterStagedUpdateRun."""
    emu.create(
        "ClusterStagedUpdateStrategy",
        {"metadata": {"name": run}, "spec": stages(*stage_names, before=before)},
    )
    emu.create(
        "ClusterResourcePlacement",
        {
            "metadata": {"name": run},
            "spec": {
                "resourceSelectors": [
                    {"group": "", "version": "v1", "kind": "Namespace", "name": APP_NS}
                ],
                "policy": {"placementType": "PickAll"},
                "strategy": {"type": "External"},
            },
        },
    )
    emu.create(
        "ClusterStagedUpdateRun",
        {
            "metadata": {"name": run},
            "spec": {
                "placementName": run,
                "resourceSnapshotIndex": "0",
                "stagedRolloutStrategyName": run,
                "state": "Run",
            },
        },
    )


def start_namespaced_run(
    emu: KubeFleetEmulator, namespace: str, run: str, *stage_names: str
) -> None:
    """StagedUpdateStrategy + PickAll ResourcePlacement + StagedUpdateRun in namespace."""
    with emu.hub.api_client() as api:
        try:
            k8s.CoreV1Api(api).create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    meta = {"name": run, "namespace": namespace}
    emu.create("StagedUpdateStrategy", {"metadata": meta, "spec": stages(*stage_names)}, namespace)
    emu.create(
        "ResourcePlacement",
        {
            "metadata": meta,
            "spec": {
                "resourceSelectors": [
                    {"group": "apps", "version": "v1", "kind": "Deployment", "name": APP}
                ],
                "policy": {"placementType": "PickAll"},
                "strategy": {"type": "External"},
            },
        },
        namespace,
    )
    emu.create(
        "StagedUpdateRun",
        {
            "metadata": meta,
            "spec": {
                "placementName": run,
                "resourceSnapshotIndex": "0",
                "stagedRolloutStrategyName": run,
                "state": "Run",
            },
        },
        namespace,
    )


def approval(
    emu: KubeFleetEmulator, run: str, stage: str, namespace: str = "", task: str = "after"
) -> dict[str, Any] | None:
    kind = "ApprovalRequest" if namespace else "ClusterApprovalRequest"
    return emu.get(kind, f"{run}-{task}-{stage}", namespace)


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def approved(obj: dict[str, Any] | None) -> bool:
    """Approved=True for the object's generation (what KubeFleet checks)."""
    cond = conditions(obj).get("Approved")
    return bool(
        obj
        and cond
        and cond["status"] == "True"
        and cond.get("observedGeneration") == obj["metadata"]["generation"]
    )


def health_condition(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plugin's condition on an approval request."""
    return conditions(obj).get(HEALTH_CONDITION)


def events_about(hub: KubeCluster, name: str, namespace: str = "default") -> list[Any]:
    with hub.api_client() as api:
        found = k8s.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
    return list(found.items)


def run_succeeded(emu: KubeFleetEmulator, run: str, namespace: str = "") -> bool:
    kind = "StagedUpdateRun" if namespace else "ClusterStagedUpdateRun"
    obj = emu.get(kind, run, namespace)
    return conditions(obj).get("Succeeded", {}).get("status") == "True"


def member_object(member: KubeCluster, plural: str, name: str) -> dict[str, Any] | None:
    with member.api_client() as api:
        try:
            return dict(k8s.CustomObjectsApi(api).get_cluster_custom_object(*METRIC, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def hub_report(
    hub: KubeCluster, cluster: str, name: str, cookbook: str = "current"
) -> dict[str, Any] | None:
    with hub.api_client() as api:
        try:
            return dict(
                k8s.CustomObjectsApi(api).get_namespaced_custom_object(
                    *GROUPS[cookbook], f"fleet-member-{cluster}", "metriccollectorreports", name
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
