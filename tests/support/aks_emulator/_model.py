"""State and rules of the AKS (Azure Resource Manager, Microsoft.ContainerService) emulator.

Wire shapes follow the api-version the installed azure-mgmt-containerservice uses by default
(its _configuration.py) and the paths of its generated operations
(azure/mgmt/containerservice/operations/_operations.py: ManagedClustersOperations,
AgentPoolsOperations, MaintenanceConfigurationsOperations), which are generated from the AKS REST
reference (https://learn.microsoft.com/rest/api/aks/). Each rule below names its source.
"""

from __future__ import annotations

import copy
import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApiError", "EmulatorState", "Fault", "cluster_key", "parse_version"]

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# ARM's transitional provisioning states of a managed cluster / agent pool while an operation
# runs (AKS REST reference, ManagedClusterProperties.provisioningState: "The current
# provisioning state"; the values AKS reports during upgrades).
UPGRADING = "Upgrading"
NODE_IMAGE = "UpgradingNodeImageVersion"
SUCCEEDED = "Succeeded"
FAILED = "Failed"


class ApiError(Exception):
    """An ARM error answer: status, error.code, error.message and extra headers.

    ARM's error body is {"error": {"code", "message"}} (Azure REST API guidelines, "Handling
    errors"; azure-mgmt-core's ARMErrorFormat reads exactly these fields).
    """

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def parse_version(text: str) -> tuple[int, int, int]:
    match = _VERSION.match(text or "")
    if not match:
        raise ApiError(
            400,
            "InvalidParameter",
            f"The value of parameter kubernetesVersion is invalid: {text!r}.",
        )
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch)


def cluster_key(subscription: str, group: str, name: str) -> str:
    """ARM resource ids are case-insensitive (ARM resource naming rules): keys are lower case."""
    return f"{subscription}/{group}/{name}".lower()


@dataclass
class Fault:
    """A failure the next operation on a cluster (or pool) ends with: the async operation's
    status becomes Failed with this error (ARM async operations: "status": "Failed" with an
    "error" object; https://learn.microsoft.com/azure/azure-resource-manager/management/
    async-operations)."""

    code: str = "UpgradeFailed"
    message: str = "Drain of node aks-nodepool1-0 did not complete."
    pool: str = ""  # only an operation on this pool ("" any)


@dataclass
class _Operation:
    id: str
    key: str  # cluster key
    location: str
    kind: str  # "cluster" | "pool" | "nodeImage"
    pool: str
    target: str
    started: float
    ends: float
    fault: Fault | None = None
    status: str = "InProgress"
    finished: float = 0.0


@dataclass
class _Cluster:
    subscription: str
    group: str
    name: str
    location: str
    tags: dict[str, str]
    version: str  # currentKubernetesVersion
    desired: str  # kubernetesVersion
    pools: dict[str, dict[str, Any]]  # name -> agent pool properties
    state: str = SUCCEEDED
    power: str = "Running"
    etag: str = field(default_factory=lambda: uuid.uuid4().hex)
    maintenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    operation: str = ""  # id of the running operation

    @property
    def id(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/"
            f"Microsoft.ContainerService/managedClusters/{self.name}"
        )


class EmulatorState:
    """Clusters, versions offered per location, operations and injected faults."""

    def __init__(self, op_seconds: float = 0.5, node_image: str = "AKSUbuntu-2204gen2-202501.01.0"):
        self.op_seconds = op_seconds
        self.latest_node_image = node_image
        self._lock = threading.RLock()
        self._clusters: dict[str, _Cluster] = {}
        self._offered: dict[str, list[str]] = {}
        self._ops: dict[str, _Operation] = {}
        self._faults: dict[str, Fault] = {}
        self._throttle = 0
        self._throttle_after = 1
        self._transient = 0
        self._transient_status = 503
        self._seq = itertools.count(1)
        self.calls: list[tuple[str, dict[str, Any] | None]] = []

    # ------------------------------------------------------------------ setup (tests)

    def set_versions(self, location: str, versions: list[str]) -> None:
        for text in versions:
            parse_version(text)
        with self._lock:
            self._offered[location.lower()] = sorted(versions, key=parse_version)

    def add_cluster(
        self,
        subscription: str,
        group: str,
        name: str,
        *,
        location: str,
        version: str,
        pools: list[dict[str, Any]],
        tags: dict[str, str] | None = None,
    ) -> str:
        with self._lock:
            cluster = _Cluster(
                subscription,
                group,
                name,
                location,
                dict(tags or {}),
                version,
                version,
                {
                    p["name"]: {
                        "count": p.get("count", 3),
                        "vmSize": p.get("vmSize", "Standard_D4s_v5"),
                        "mode": p.get("mode", "User"),
                        "osType": "Linux",
                        "type": "VirtualMachineScaleSets",
                        "orchestratorVersion": p.get("version", version),
                        "currentOrchestratorVersion": p.get("version", version),
                        "nodeImageVersion": p.get("nodeImage", "AKSUbuntu-2204gen2-202410.15.0"),
                        "provisioningState": SUCCEEDED,
                        "powerState": {"code": "Running"},
                        "upgradeSettings": {"maxSurge": "10%"},
                    }
                    for p in pools
                },
            )
            self._clusters[cluster_key(subscription, group, name)] = cluster
            return cluster.id

    def set_maintenance(self, key: str, name: str, properties: dict[str, Any]) -> None:
        with self._lock:
            self._clusters[key].maintenance[name] = copy.deepcopy(properties)

    def fail_next(self, key: str, fault: Fault) -> None:
        with self._lock:
            self._faults[key] = fault

    def throttle(self, count: int, retry_after: int = 1) -> None:
        """The next count requests answer 429 with Retry-After (ARM throttling:
        https://learn.microsoft.com/azure/azure-resource-manager/management/
        request-limits-and-throttling, "Error code": 429 and a Retry-After header)."""
        with self._lock:
            self._throttle = count
            self._throttle_after = retry_after

    def transient(self, count: int, status: int = 503) -> None:
        """The next count requests answer status (a 5xx), as a transient ARM failure."""
        with self._lock:
            self._transient = count
            self._transient_status = status

    def hold(self, key: str) -> None:
        """Another client's operation that ARM has accepted but the cluster's
        provisioningState does not show yet (ARM's reads are eventually consistent): the next
        mutation answers 409 OperationNotAllowed while reads still say Succeeded."""
        with self._lock:
            self._clusters[key].operation = "held-by-another-client"

    def set_state(self, key: str, state: str) -> None:
        """Sets a cluster's provisioningState (e.g. an operation AKS runs by itself)."""
        with self._lock:
            self._clusters[key].state = state

    # ------------------------------------------------------------------ inspection

    def snapshot(self, key: str) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return self._cluster_body(self._clusters[key])

    def record(self, name: str, body: dict[str, Any] | None) -> None:
        with self._lock:
            self.calls.append((name, copy.deepcopy(body)))

    def gate(self) -> None:
        """Injected throttling and transient failures, before any other rule."""
        with self._lock:
            if self._throttle > 0:
                self._throttle -= 1
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "The request is being throttled.",
                    {"Retry-After": str(self._throttle_after)},
                )
            if self._transient > 0:
                self._transient -= 1
                raise ApiError(
                    self._transient_status,
                    "InternalServerError",
                    "An internal server error occurred. Please try again.",
                )

    # ------------------------------------------------------------------ the clock

    def _advance(self) -> None:
        """Ends operations whose time has come: versions change at the end, a fault makes the
        operation Failed and the resource's provisioningState Failed (AKS REST reference:
        provisioningState "Failed" after a failed upgrade; the version stays the old one)."""
        now = time.monotonic()
        for op in self._ops.values():
            if op.status != "InProgress" or now < op.ends:
                continue
            cluster = self._clusters[op.key]
            op.finished = now
            cluster.operation = ""
            if op.fault is not None:
                op.status = FAILED
                if op.kind == "cluster":
                    cluster.state = FAILED
                else:
                    cluster.pools[op.pool]["provisioningState"] = FAILED
                continue
            op.status = SUCCEEDED
            if op.kind == "cluster":
                cluster.version = op.target
                cluster.state = SUCCEEDED
            elif op.kind == "pool":
                pool = cluster.pools[op.pool]
                pool["currentOrchestratorVersion"] = op.target
                pool["provisioningState"] = SUCCEEDED
            else:
                pool = cluster.pools[op.pool]
                pool["nodeImageVersion"] = op.target
                pool["provisioningState"] = SUCCEEDED
            cluster.etag = uuid.uuid4().hex

    # ------------------------------------------------------------------ reads

    def _get(self, subscription: str, group: str, name: str) -> _Cluster:
        cluster = self._clusters.get(cluster_key(subscription, group, name))
        if cluster is None or cluster.subscription.lower() != subscription.lower():
            # ARM's 404 for a missing tracked resource (ResourceNotFound).
            raise ApiError(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.ContainerService/managedClusters/{name}' under "
                f"resource group '{group}' was not found.",
            )
        return cluster

    def _pool_body(self, cluster: _Cluster, name: str) -> dict[str, Any]:
        return {
            "id": f"{cluster.id}/agentPools/{name}",
            "name": name,
            "type": "Microsoft.ContainerService/managedClusters/agentPools",
            "properties": copy.deepcopy(cluster.pools[name]),
        }

    def _cluster_body(self, cluster: _Cluster) -> dict[str, Any]:
        return {
            "id": cluster.id,
            "name": cluster.name,
            "type": "Microsoft.ContainerService/ManagedClusters",
            "location": cluster.location,
            "tags": dict(cluster.tags),
            "eTag": cluster.etag,
            "properties": {
                "provisioningState": cluster.state,
                "powerState": {"code": cluster.power},
                "kubernetesVersion": cluster.desired,
                "currentKubernetesVersion": cluster.version,
                "dnsPrefix": cluster.name,
                "agentPoolProfiles": [
                    {"name": name, **copy.deepcopy(props)}
                    for name, props in sorted(cluster.pools.items())
                ],
            },
        }

    def list_clusters(self, subscription: str, group: str | None) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            return [
                self._cluster_body(c)
                for k, c in sorted(self._clusters.items())
                if c.subscription.lower() == subscription.lower()
                and (group is None or c.group.lower() == group.lower())
            ]

    def get_cluster(self, subscription: str, group: str, name: str) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return self._cluster_body(self._get(subscription, group, name))

    def list_pools(self, subscription: str, group: str, name: str) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            cluster = self._get(subscription, group, name)
            return [self._pool_body(cluster, p) for p in sorted(cluster.pools)]

    def get_pool(self, subscription: str, group: str, name: str, pool: str) -> dict[str, Any]:
        with self._lock:
            self._advance()
            cluster = self._get(subscription, group, name)
            if pool not in cluster.pools:
                raise ApiError(
                    404, "NotFound", f"Agent pool {pool} not found in managed cluster {name}."
                )
            return self._pool_body(cluster, pool)

    def _offered_for(self, cluster: _Cluster) -> list[str]:
        return list(self._offered.get(cluster.location.lower(), []))

    def upgrade_profile(self, subscription: str, group: str, name: str) -> dict[str, Any]:
        """GET managedClusters/{name}/upgradeProfiles/default (ManagedClusters_GetUpgradeProfile).

        The control plane's upgrades are the region's versions newer than the current one
        within the next minor: AKS does not allow skipping minor versions
        (https://learn.microsoft.com/azure/aks/upgrade-aks-cluster, "Skipping multiple minor
        versions isn't supported"). A pool's upgrades are the versions newer than its own up
        to the control plane's: pools may not be newer than the control plane
        (https://learn.microsoft.com/azure/aks/supported-kubernetes-versions, "node pool ...
        can't be newer than the control plane").
        """
        with self._lock:
            self._advance()
            cluster = self._get(subscription, group, name)
            offered = self._offered_for(cluster)
            major, minor, _ = parse_version(cluster.version)
            upgrades = [
                {"kubernetesVersion": v}
                for v in offered
                if parse_version(v) > parse_version(cluster.version)
                and parse_version(v)[:2] <= (major, minor + 1)
            ]
            pools = []
            for pool_name, props in sorted(cluster.pools.items()):
                current = props["currentOrchestratorVersion"]
                pools.append(
                    {
                        "name": pool_name,
                        "kubernetesVersion": current,
                        "osType": "Linux",
                        "upgrades": [
                            {"kubernetesVersion": v}
                            for v in offered
                            if parse_version(current)
                            < parse_version(v)
                            <= parse_version(cluster.version)
                        ],
                    }
                )
            return {
                "id": f"{cluster.id}/upgradeprofiles/default",
                "name": "default",
                "type": "Microsoft.ContainerService/managedClusters/upgradeprofiles",
                "properties": {
                    "controlPlaneProfile": {
                        "kubernetesVersion": cluster.version,
                        "name": None,
                        "osType": "Linux",
                        "upgrades": upgrades,
                    },
                    "agentPoolProfiles": pools,
                },
            }

    def pool_upgrade_profile(
        self, subscription: str, group: str, name: str, pool: str
    ) -> dict[str, Any]:
        """GET agentPools/{pool}/upgradeProfiles/default (AgentPools_GetUpgradeProfile): the
        pool's upgrades and latestNodeImageVersion (https://learn.microsoft.com/azure/aks/
        node-image-upgrade, "Check for available node image upgrades")."""
        with self._lock:
            body = self.get_pool(subscription, group, name, pool)
            cluster = self._get(subscription, group, name)
            current = body["properties"]["currentOrchestratorVersion"]
            return {
                "id": f"{body['id']}/upgradeProfiles/default",
                "name": "default",
                "type": "Microsoft.ContainerService/managedClusters/agentPools/upgradeProfiles",
                "properties": {
                    "kubernetesVersion": current,
                    "osType": "Linux",
                    "upgrades": [
                        {"kubernetesVersion": v}
                        for v in self._offered_for(cluster)
                        if parse_version(current)
                        < parse_version(v)
                        <= parse_version(cluster.version)
                    ],
                    "latestNodeImageVersion": self.latest_node_image,
                },
            }

    def maintenance(self, subscription: str, group: str, name: str) -> list[dict[str, Any]]:
        """GET managedClusters/{name}/maintenanceConfigurations
        (MaintenanceConfigurations_ListByManagedCluster)."""
        with self._lock:
            cluster = self._get(subscription, group, name)
            return [
                {
                    "id": f"{cluster.id}/maintenanceConfigurations/{n}",
                    "name": n,
                    "type": "Microsoft.ContainerService/managedClusters/maintenanceConfigurations",
                    "properties": copy.deepcopy(props),
                }
                for n, props in sorted(cluster.maintenance.items())
            ]

    def operation(self, op_id: str) -> dict[str, Any]:
        """The Azure-AsyncOperation status resource (ARM async operations: "status" one of
        InProgress / Succeeded / Failed / Canceled, "error" when Failed)."""
        with self._lock:
            self._advance()
            op = self._ops.get(op_id)
            if op is None:
                raise ApiError(404, "NotFound", f"Operation {op_id} not found.")
            body: dict[str, Any] = {
                "id": op.id,
                "name": op.id,
                "status": op.status,
                "startTime": "2026-01-01T00:00:00Z",
            }
            if op.status != "InProgress":
                body["endTime"] = "2026-01-01T00:10:00Z"
            if op.status == FAILED and op.fault is not None:
                body["error"] = {"code": op.fault.code, "message": op.fault.message}
            return body

    def operation_of(self, op_id: str) -> tuple[str, str]:
        with self._lock:
            op = self._ops[op_id]
            return op.location, op.key

    # ------------------------------------------------------------------ mutations

    def _busy(self, cluster: _Cluster) -> None:
        """One operation at a time per cluster: ARM answers 409 OperationNotAllowed while
        another operation runs (https://learn.microsoft.com/troubleshoot/azure/
        azure-kubernetes/error-codes/operationnotallowed-error)."""
        if cluster.operation or cluster.state not in (SUCCEEDED, FAILED):
            raise ApiError(
                409,
                "OperationNotAllowed",
                "Operation is not allowed because there's an in progress operation on the "
                "managed cluster.",
            )

    def _check_etag(self, cluster: _Cluster, if_match: str) -> None:
        # If-Match on PUT (ManagedClusters_CreateOrUpdate's etag / match_condition): a stale
        # etag answers 412 PreconditionFailed.
        if if_match and if_match not in ("*", cluster.etag, f'"{cluster.etag}"'):
            raise ApiError(
                412, "PreconditionFailed", "The eTag does not match the current resource."
            )

    def _start(self, cluster: _Cluster, kind: str, pool: str, target: str) -> _Operation:
        key = cluster_key(cluster.subscription, cluster.group, cluster.name)
        fault = self._faults.get(key)
        if fault is not None and fault.pool in ("", pool):
            del self._faults[key]
        else:
            fault = None
        now = time.monotonic()
        op = _Operation(
            id=str(uuid.uuid4()),
            key=key,
            location=cluster.location,
            kind=kind,
            pool=pool,
            target=target,
            started=now,
            ends=now + self.op_seconds,
            fault=fault,
        )
        self._ops[op.id] = op
        cluster.operation = op.id
        cluster.etag = uuid.uuid4().hex
        return op

    def _check_target(self, cluster: _Cluster, target: str) -> None:
        offered = self._offered_for(cluster)
        if target not in offered:
            # An unknown version: AKS answers 400 with code K8sVersionNotSupported
            # (https://learn.microsoft.com/troubleshoot/azure/azure-kubernetes/error-codes/
            # k8sversionnotsupported-error).
            raise ApiError(
                400,
                "K8sVersionNotSupported",
                f"Version {target} is not supported in this region.",
            )
        if parse_version(target) < parse_version(cluster.version):
            raise ApiError(
                400,
                "NotAllowedDowngrade",
                f"Downgrading kubernetes version from {cluster.version} to {target} is not "
                "allowed.",
            )
        major, minor, _ = parse_version(cluster.version)
        if parse_version(target)[:2] > (major, minor + 1):
            raise ApiError(
                400,
                "UpgradeNotAllowed",
                f"Upgrading kubernetes version from {cluster.version} to {target} is not "
                "allowed: upgrades skipping a minor version are not supported.",
            )

    def put_cluster(
        self, subscription: str, group: str, name: str, body: dict[str, Any], if_match: str
    ) -> tuple[dict[str, Any], _Operation | None]:
        """PUT managedClusters/{name} (ManagedClusters_CreateOrUpdate) on an existing cluster.

        A new kubernetesVersion upgrades the control plane; agentPoolProfiles whose
        orchestratorVersion is unchanged are left alone, so a PUT changing only
        kubernetesVersion is a control-plane-only upgrade (as `az aks upgrade
        --control-plane-only` sends it). A pool's orchestratorVersion change in the same PUT
        is not emulated (400) since the plugin never sends one.
        """
        with self._lock:
            self._advance()
            cluster = self._get(subscription, group, name)
            self._check_etag(cluster, if_match)
            props = body.get("properties") or {}
            target = props.get("kubernetesVersion") or cluster.desired
            for profile in props.get("agentPoolProfiles") or []:
                known = cluster.pools.get(profile.get("name", ""))
                wanted = profile.get("orchestratorVersion")
                if known is not None and wanted and wanted != known["orchestratorVersion"]:
                    raise ApiError(
                        400,
                        "InvalidParameter",
                        "The emulator does not upgrade agent pools in a managed cluster PUT.",
                    )
            if "tags" in body:
                cluster.tags = dict(body["tags"] or {})
            if target == cluster.version and cluster.state != FAILED:
                cluster.desired = target
                return self._cluster_body(cluster), None
            self._busy(cluster)
            if target != cluster.version:
                self._check_target(cluster, target)
            op = self._start(cluster, "cluster", "", target)
            cluster.desired = target
            cluster.state = UPGRADING
            return self._cluster_body(cluster), op

    def put_pool(
        self,
        subscription: str,
        group: str,
        name: str,
        pool: str,
        body: dict[str, Any],
        if_match: str,
    ) -> tuple[dict[str, Any], _Operation | None]:
        """PUT agentPools/{pool} (AgentPools_CreateOrUpdate) on an existing pool: a new
        orchestratorVersion upgrades the pool. A pool may not be newer than the control plane:
        400 NodePoolMcVersionIncompatible (https://learn.microsoft.com/troubleshoot/azure/
        azure-kubernetes/error-codes/nodepoolmcversionincompatible-error)."""
        with self._lock:
            self._advance()
            cluster = self._get(subscription, group, name)
            if pool not in cluster.pools:
                raise ApiError(
                    404, "NotFound", f"Agent pool {pool} not found in managed cluster {name}."
                )
            props = cluster.pools[pool]
            if if_match and if_match not in ("*", props.get("eTag", ""), f'"{props.get("eTag")}"'):
                raise ApiError(412, "PreconditionFailed", "The eTag does not match.")
            target = (body.get("properties") or {}).get("orchestratorVersion") or props[
                "orchestratorVersion"
            ]
            current = props["currentOrchestratorVersion"]
            if target == current and props["provisioningState"] != FAILED:
                props["orchestratorVersion"] = target
                return self._pool_body(cluster, pool), None
            self._busy(cluster)
            if parse_version(target) > parse_version(cluster.version):
                raise ApiError(
                    400,
                    "NodePoolMcVersionIncompatible",
                    f"Node pool version {target} and control plane version {cluster.version} "
                    "are incompatible. Minor version of node pool cannot be more than control "
                    "plane version.",
                )
            if target != current:
                if target not in self._offered_for(cluster):
                    raise ApiError(
                        400,
                        "K8sVersionNotSupported",
                        f"Version {target} is not supported in this region.",
                    )
                if parse_version(target) < parse_version(current):
                    raise ApiError(
                        400,
                        "NotAllowedDowngrade",
                        f"Downgrading agent pool {pool} from {current} to {target} is not allowed.",
                    )
            op = self._start(cluster, "pool", pool, target)
            props["orchestratorVersion"] = target
            props["provisioningState"] = UPGRADING
            return self._pool_body(cluster, pool), op

    def upgrade_node_image(self, subscription: str, group: str, name: str, pool: str) -> _Operation:
        """POST agentPools/{pool}/upgradeNodeImageVersion (AgentPools_UpgradeNodeImageVersion):
        202 Accepted, the pool's provisioningState UpgradingNodeImageVersion until the nodes run
        the latest node image (https://learn.microsoft.com/azure/aks/node-image-upgrade)."""
        with self._lock:
            self._advance()
            cluster = self._get(subscription, group, name)
            if pool not in cluster.pools:
                raise ApiError(
                    404, "NotFound", f"Agent pool {pool} not found in managed cluster {name}."
                )
            self._busy(cluster)
            op = self._start(cluster, "nodeImage", pool, self.latest_node_image)
            cluster.pools[pool]["provisioningState"] = NODE_IMAGE
            return op

    def in_progress(self, key: str) -> bool:
        with self._lock:
            self._advance()
            return bool(self._clusters[key].operation)

    def next_seq(self) -> int:
        return next(self._seq)
