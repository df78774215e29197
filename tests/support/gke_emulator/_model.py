"""State of the GKE API emulator: clusters, node pools, server configs, backend services, and
long-running operations that advance with the clock.

Resources are the client libraries' own protobuf messages (google.container.v1 and
google.cloud.compute.v1), so the HTTP layer serializes exactly the documented JSON. Every public
method takes the lock and first advances operations to "now", so reads always see the state an
operation reached, whether or not anyone polled it.
"""

from __future__ import annotations

import base64
import itertools
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import compute_v1, container_v1
from google.protobuf import json_format

from plugins.sdk import versions
from tests.support.gke_emulator._versions import (
    VersionError,
    check_master,
    check_node,
    master_target,
    node_target,
)

__all__ = [
    "ApiError",
    "ComputeFault",
    "EmulatorState",
    "OpTiming",
    "UpgradeFault",
]

# Raw protobuf classes of the documented resources (proto-plus wrappers expose them via .pb()).
Cluster = container_v1.Cluster.pb()
NodePool = container_v1.NodePool.pb()
GkeOperation = container_v1.Operation.pb()
ServerConfig = container_v1.ServerConfig.pb()
BackendService = compute_v1.BackendService.pb()
ComputeOperation = compute_v1.Operation.pb()

OpType = container_v1.Operation.Type
OpStatus = container_v1.Operation.Status
ClusterStatus = container_v1.Cluster.Status
PoolStatus = container_v1.NodePool.Status
Scope = container_v1.MaintenanceExclusionOptions.Scope
EndTimeBehavior = container_v1.MaintenanceExclusionOptions.EndTimeBehavior
Channel = container_v1.ReleaseChannel.Channel
NodePoolUpdateStrategy = container_v1.NodePoolUpdateStrategy

CONTAINER_BASE = "https://container.googleapis.com/v1"
COMPUTE_BASE = "https://www.googleapis.com/compute/v1"
_CODE_CANCELLED = 1


class ApiError(Exception):
    """An HTTP error answered in the Google API error format."""

    _STATUS_BY_CODE = {
        400: "INVALID_ARGUMENT",
        404: "NOT_FOUND",
        409: "ALREADY_EXISTS",
        412: "FAILED_PRECONDITION",
        429: "RESOURCE_EXHAUSTED",
        500: "INTERNAL",
        503: "UNAVAILABLE",
    }

    def __init__(
        self,
        http_code: int,
        message: str,
        status: str = "",
        *,
        reason: str = "",
        details: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(message)
        self.http_code = http_code
        self.message = message
        self.status = status or self._STATUS_BY_CODE.get(http_code, "UNKNOWN")
        self.reason = reason  # compute's errors[].reason, e.g. conditionNotMet
        self.details = [dict(d) for d in details]  # google.rpc details, e.g. an ErrorInfo


def _error_info(reason: str, domain: str, **metadata: str) -> dict[str, Any]:
    """A google.rpc.ErrorInfo as Google's JSON error bodies carry it in error.details."""
    info: dict[str, Any] = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": domain,
    }
    if metadata:
        info["metadata"] = dict(metadata)
    return info


_CONCURRENT_TYPES = frozenset({OpType.AUTO_REPAIR_NODES, OpType.SET_NODE_POOL_MANAGEMENT})


def busy_error(shape: str, operation: str, cluster: str) -> ApiError:
    """GKE's "another operation is running on this cluster" answer, in one of the shapes GKE
    sends (all HTTP 400 FAILED_PRECONDITION, gRPC code 9):

    - "incompatible": "Cluster is running incompatible operation operation-....", errors[].reason
      failedPrecondition (as quoted from GKE in rancher/gke-operator PR #509, 2024, and
      hashicorp/terraform-provider-google issues);
    - "upgrading": "Operation operation-... is currently upgrading cluster C. Please wait and
      try again once it is done." (hashicorp/terraform-provider-google issue #3650, 2020;
      banzaicloud/pipeline issue #623), errors[].reason failedPrecondition;
    - "operating": "Operation operation-... is currently operating on cluster C. Please wait
      and try again once it is done." (gcloud and the Node.js client quoting GKE while a node
      repair runs, code 9);
    - "reason": the structured form only: a google.rpc.ErrorInfo with reason
      CLUSTER_ALREADY_HAS_OPERATION (domain container.googleapis.com) and a text that names no
      operation (the reason gcloud prints as "FAILED_PRECONDITION: ...
      CLUSTER_ALREADY_HAS_OPERATION"); the caller must find the operation itself.
    """
    busy = _error_info("CLUSTER_ALREADY_HAS_OPERATION", "container.googleapis.com")
    texts = {
        "incompatible": f"Cluster is running incompatible operation {operation}.",
        "upgrading": f"Operation {operation} is currently upgrading cluster {cluster}. "
        "Please wait and try again once it is done.",
        "operating": f"Operation {operation} is currently operating on cluster {cluster}. "
        "Please wait and try again once it is done.",
        "reason": "The cluster already has an operation in progress.",
    }
    if shape not in texts:
        raise ValueError(f"busy shape {shape!r}: one of {', '.join(texts)}")
    if shape == "reason":
        return ApiError(400, texts[shape], "FAILED_PRECONDITION", details=[busy])
    return ApiError(400, texts[shape], "FAILED_PRECONDITION", reason="failedPrecondition")


def quota_error(api: str) -> ApiError:
    """A rate-quota answer: Compute's HTTP 403 with errors[].reason rateLimitExceeded (Compute
    docs, "API rate limits": "Rate Limit Exceeded ... wait a minute then try your request
    again"; per user: userRateLimitExceeded), or GKE's HTTP 429 RESOURCE_EXHAUSTED with an
    ErrorInfo RATE_LIMIT_EXCEEDED (Google APIs' quota errors, domain googleapis.com)."""
    if api == "compute":
        return ApiError(403, "Rate Limit Exceeded", "PERMISSION_DENIED", reason="rateLimitExceeded")
    return ApiError(
        429,
        "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' of service "
        "'container.googleapis.com'.",
        "RESOURCE_EXHAUSTED",
        details=[
            _error_info("RATE_LIMIT_EXCEEDED", "googleapis.com", service="container.googleapis.com")
        ],
    )


@dataclass
class Quota:
    """At most `calls` calls of one API per `window` seconds; more answer quota_error."""

    calls: int
    window: float
    seen: list[float] = field(default_factory=list)

    def admit(self, now: float) -> bool:
        self.seen = [t for t in self.seen if now - t < self.window]
        if len(self.seen) >= self.calls:
            return False
        self.seen.append(now)
        return True


@dataclass
class OpTiming:
    """How long an operation stays PENDING, then RUNNING, before it is DONE (seconds)."""

    pending: float = 0.05
    running: float = 0.5


@dataclass
class UpgradeFault:
    """Makes the next upgrade of a kind on a cluster end DONE with this error (state unchanged)."""

    op_type: int
    cluster: str  # projects/P/locations/L/clusters/C
    message: str
    code: int = 13  # google.rpc.Code INTERNAL
    remaining: int = 1


@dataclass
class ComputeFault:
    """Makes the next PATCH of a backend service end DONE with this error (change not applied)."""

    backend_service: str  # projects/P/global/backendServices/NAME
    message: str
    code: str = "INTERNAL_ERROR"
    remaining: int = 1


@dataclass
class _Op:
    """One container operation and its schedule."""

    pb: Any  # container_v1 Operation (raw protobuf)
    project: str
    location: str
    cluster: str
    pool: str
    target: str
    created: float
    timing: OpTiming
    fault: UpgradeFault | None
    nodes_total: int
    cancel_at: float | None = None
    applied: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.project, self.location, self.cluster)


@dataclass
class _ComputeOp:
    pb: Any  # compute_v1 Operation (raw protobuf)
    project: str
    service: str
    patched: Any  # the BackendService to apply at DONE
    created: float
    seconds: float
    fault: ComputeFault | None
    extras: dict[str, dict[str, Any]] | None = None  # newer-than-client fields per group


@dataclass
class _Location:
    config: Any  # ServerConfig
    project_number: str = ""


@dataclass
class EmulatorState:
    """Everything the emulator serves, guarded by one lock; times come from `clock`."""

    op_timing: dict[int, OpTiming] = field(
        default_factory=lambda: {
            OpType.UPGRADE_MASTER: OpTiming(),
            OpType.UPGRADE_NODES: OpTiming(),
        }
    )
    compute_op_seconds: float = 0.2
    abort_seconds: float = 0.1
    #: Emulated seconds per second of a blue-green pool's soaks (1.0: GKE's real waits).
    soak_scale: float = 1.0
    clock: Any = time.monotonic
    lock: threading.RLock = field(default_factory=threading.RLock)
    calls: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)  # Authorization headers seen
    clusters: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    server_configs: dict[tuple[str, str], Any] = field(default_factory=dict)
    project_numbers: dict[str, str] = field(default_factory=dict)
    operations: dict[tuple[str, str, str], _Op] = field(default_factory=dict)
    backend_services: dict[tuple[str, str], Any] = field(default_factory=dict)
    compute_ops: dict[tuple[str, str], _ComputeOp] = field(default_factory=dict)
    compute_request_ids: dict[tuple[str, str], str] = field(default_factory=dict)
    upgrade_faults: list[UpgradeFault] = field(default_factory=list)
    compute_faults: list[ComputeFault] = field(default_factory=list)
    http_faults: dict[str, list[ApiError]] = field(default_factory=dict)
    missing_zones: list[set[str]] = field(default_factory=list)  # per ListOperations answer
    busy_shape: str = "incompatible"  # how a busy cluster is refused (busy_error)
    before_call: dict[str, list[Callable[[], object]]] = field(default_factory=dict)
    quotas: dict[str, Quota] = field(default_factory=dict)  # "compute" / "container"
    # Backend fields compute knows but the pinned google-cloud-compute client does not (compute
    # keeps adding Backend fields: customMetrics, trafficDuration, orchestrationInfo were all
    # newer than older clients); kept per backend group, served and patched as JSON.
    backend_extras: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=dict)
    controlled: set[tuple[str, str]] = field(default_factory=set)  # a controller reverts
    _serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # ----------------------------------------------------------------- set-up (test side)

    def project_number(self, project: str) -> str:
        """The project's number (selfLinks of operations carry numbers, as GKE's do)."""
        if project not in self.project_numbers:
            self.project_numbers[project] = str(100000000000 + len(self.project_numbers) * 7919)
        return self.project_numbers[project]

    def add_cluster(self, cluster: Any, project: str, location: str) -> None:
        with self.lock:
            key = (project, location, cluster.name)
            if key in self.clusters:
                raise ValueError(f"cluster {key} exists already")
            cluster.location = location
            cluster.zone = location
            cluster.self_link = (
                f"{CONTAINER_BASE}/{_link_path(project, location)}/clusters/{cluster.name}"
            )
            for pool in cluster.node_pools:
                pool.self_link = f"{cluster.self_link}/nodePools/{pool.name}"
            _refresh_node_version(cluster)
            self.clusters[key] = cluster

    def set_server_config(self, project: str, location: str, config: Any) -> None:
        with self.lock:
            self.server_configs[(project, location)] = config

    def add_backend_service(
        self,
        project: str,
        service: Any,
        extras: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        controlled: bool = False,
    ) -> None:
        """A backend service; extras: newer-than-client fields per backend group; controlled:
        a controller owns it and reverts every capacityScaler change (as a multi-cluster
        Gateway controller reconciles the backend services it manages)."""
        with self.lock:
            self.backend_extras[(project, service.name)] = {
                group: dict(fields) for group, fields in (extras or {}).items()
            }
            if controlled:
                self.controlled.add((project, service.name))
            service.kind = "compute#backendService"
            service.id = next(self._serial) + 4000000000000000000
            service.self_link = (
                f"{COMPUTE_BASE}/projects/{project}/global/backendServices/{service.name}"
            )
            service.fingerprint = _fingerprint()
            self.backend_services[(project, service.name)] = service

    def fail_http(self, method: str, error: ApiError, times: int = 1) -> None:
        """The next `times` calls of method (e.g. "UpdateMaster") answer this HTTP error."""
        with self.lock:
            self.http_faults.setdefault(method, []).extend([error] * times)

    def take_before_call(self, method: str) -> list[Callable[[], object]]:
        with self.lock:
            return self.before_call.pop(method, [])

    def take_http_fault(self, method: str) -> ApiError | None:
        with self.lock:
            queue = self.http_faults.get(method)
            if queue:
                return queue.pop(0)
            api = "compute" if method.startswith("compute.") else "container"
            quota = self.quotas.get(api)
            if quota is not None and not quota.admit(time.monotonic()):
                return quota_error(api)
            return None

    def record(
        self, method: str, path: str, body: Mapping[str, Any], authorization: str = ""
    ) -> None:
        with self.lock:
            self.calls[method] += 1
            self.requests.append((method, path, dict(body)))
            self.authorizations.append(authorization)

    # ------------------------------------------------------------------------- reads

    def cluster(self, project: str, location: str, name: str) -> Any:
        with self.lock:
            self.advance()
            found = self.clusters.get((project, location, name))
            if found is None:
                raise ApiError(
                    404, f"Not found: projects/{project}/locations/{location}/clusters/{name}."
                )
            return found

    def list_clusters(self, project: str, location: str) -> list[Any]:
        with self.lock:
            self.advance()
            return [
                c
                for (p, loc, _), c in sorted(self.clusters.items())
                if p == project and location in ("-", loc)
            ]

    def node_pool(self, project: str, location: str, name: str, pool: str) -> Any:
        cluster = self.cluster(project, location, name)
        for candidate in cluster.node_pools:
            if candidate.name == pool:
                return candidate
        raise ApiError(
            404,
            f"Not found: projects/{project}/locations/{location}/clusters/{name}/nodePools/{pool}.",
        )

    def server_config(self, project: str, location: str) -> Any:
        with self.lock:
            config = self.server_configs.get((project, location))
            if config is None:
                # A zone inherits its region's config, as GKE's version lists are regional.
                region = location.rsplit("-", 1)[0] if location.count("-") == 2 else location
                config = self.server_configs.get((project, region))
            if config is None:
                raise ApiError(404, f"Location {location!r} is not known in project {project}.")
            return config

    def operation(self, project: str, location: str, name: str) -> Any:
        with self.lock:
            self.advance()
            op = self.operations.get((project, location, name))
            if op is None:
                raise ApiError(
                    404, f"Not found: projects/{project}/locations/{location}/operations/{name}."
                )
            return op.pb

    def list_operations(self, project: str, location: str) -> tuple[list[Any], list[str]]:
        """(operations, missingZones). ListOperations documents no order: they come newest
        first here, so a client that assumes any order is caught. Zones made unreachable with
        miss_zones are left out and named in missingZones, as GKE does."""
        with self.lock:
            self.advance()
            missing = sorted(self.missing_zones.pop(0)) if self.missing_zones else []
            found = [
                op
                for op in self.operations.values()
                if op.project == project
                and location in ("-", op.location)
                and not any(op.location == z or op.location.startswith(z + "-") for z in missing)
            ]
            ordered = sorted(found, key=lambda o: o.created, reverse=True)
            return [op.pb for op in ordered], missing

    def backend_service(self, project: str, name: str) -> Any:
        with self.lock:
            self.advance()
            found = self.backend_services.get((project, name))
            if found is None:
                raise ApiError(
                    404,
                    f"The resource 'projects/{project}/global/backendServices/{name}' "
                    "was not found",
                    reason="notFound",
                )
            return found

    def compute_operation(self, project: str, name: str) -> Any:
        with self.lock:
            self.advance()
            op = self.compute_ops.get((project, name))
            if op is None:
                raise ApiError(
                    404,
                    f"The resource 'projects/{project}/global/operations/{name}' was not found",
                    reason="notFound",
                )
            return op.pb

    # --------------------------------------------------------------------- mutations

    def update_master(self, project: str, location: str, name: str, request: Any) -> Any:
        with self.lock:
            cluster = self.cluster(project, location, name)
            self._refuse_if_busy(project, location, name)
            wanted = request.master_version
            if not wanted:
                raise ApiError(400, "Master version must be specified.")
            config = self.server_config(project, location)
            try:
                target = master_target(config, cluster, wanted)
                check_master(cluster, target)
            except VersionError as exc:
                raise ApiError(400, str(exc)) from None
            return self._start(OpType.UPGRADE_MASTER, project, location, cluster, "", target)

    def update_node_pool(
        self, project: str, location: str, name: str, pool_name: str, request: Any
    ) -> Any:
        with self.lock:
            cluster = self.cluster(project, location, name)
            pool = self.node_pool(project, location, name, pool_name)
            self._refuse_if_busy(project, location, name)
            if not request.image_type:
                raise ApiError(400, "Required 'image_type' is missing; set the node image type.")
            wanted = request.node_version
            if not wanted:
                raise ApiError(400, "Node version must be specified.")
            config = self.server_config(project, location)
            try:
                target = node_target(config, cluster, wanted)
                check_node(cluster, target)
            except VersionError as exc:
                raise ApiError(400, str(exc)) from None
            if request.HasField("upgrade_settings"):
                pool.upgrade_settings.CopyFrom(request.upgrade_settings)
            pool.config.image_type = request.image_type
            return self._start(OpType.UPGRADE_NODES, project, location, cluster, pool.name, target)

    def cancel_operation(self, project: str, location: str, name: str) -> None:
        with self.lock:
            self.advance()
            op = self.operations.get((project, location, name))
            if op is None:
                raise ApiError(
                    404, f"Not found: projects/{project}/locations/{location}/operations/{name}."
                )
            if op.pb.status == OpStatus.DONE:
                raise ApiError(400, f"Operation {name} is already done.", "FAILED_PRECONDITION")
            if op.cancel_at is None:
                op.cancel_at = self.clock()
            self.advance()

    def start_foreign_operation(
        self,
        op_type: int,
        project: str,
        location: str,
        name: str,
        pool: str,
        target: str,
        node: str = "",
        concurrent: bool = False,
    ) -> Any:
        """An operation nobody asked the API for (an auto-upgrade; with node, a node
        auto-repair whose targetLink ends in /nodePools/NP/node/N). GKE's own maintenance can
        run beside another operation (concurrent: several RUNNING on one cluster)."""
        with self.lock:
            cluster = self.cluster(project, location, name)
            if not concurrent:
                self._refuse_if_busy(project, location, name)
            return self._start(op_type, project, location, cluster, pool, target, node)

    def backend_service_json(self, project: str, name: str) -> dict[str, Any]:
        """GET as compute answers it: the known fields plus each backend's newer fields."""
        with self.lock:
            data = dict(json_format.MessageToDict(self.backend_service(project, name)))
            extras = self.backend_extras.get((project, name), {})
            for backend in data.get("backends", []):
                backend.update(extras.get(str(backend.get("group", "")), {}))
            return data

    def patch_backend_service_json(
        self, project: str, name: str, body: dict[str, Any], request_id: str
    ) -> Any:
        """PATCH with JSON merge patch semantics: a `backends` list replaces the old one
        whole, newer fields included (a backend sent without them loses them). Unknown fields
        are a 400, as in compute."""
        extras: dict[str, dict[str, Any]] | None = None
        if "backends" in body:
            extras = {}
            for backend in body["backends"]:
                if isinstance(backend, dict):
                    newer = {k: backend.pop(k) for k in list(backend) if k in NEWER_BACKEND_FIELDS}
                    if newer:
                        extras[str(backend.get("group", ""))] = newer
        patch = BackendService()
        try:
            json_format.ParseDict(body, patch, ignore_unknown_fields=False)
        except json_format.ParseError as exc:
            raise ApiError(400, f"Invalid JSON payload received. {exc}", reason="invalid") from None
        return self.patch_backend_service(project, name, patch, request_id, extras)

    def patch_backend_service(
        self,
        project: str,
        name: str,
        patch: Any,
        request_id: str,
        extras: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        with self.lock:
            service = self.backend_service(project, name)
            if request_id:
                known = self.compute_request_ids.get((project, request_id))
                if known is not None:
                    return self.compute_ops[(project, known)].pb
            busy = [
                op
                for op in self.compute_ops.values()
                if op.project == project and op.service == name and op.pb.status != _C_DONE
            ]
            if busy:
                raise ApiError(
                    400,
                    f"The resource 'projects/{project}/global/backendServices/{name}' is not ready",
                    reason="resourceNotReady",
                )
            if not patch.fingerprint or patch.fingerprint != service.fingerprint:
                raise ApiError(
                    412,
                    "Invalid fingerprint: pass the backend service's current fingerprint.",
                    reason="conditionNotMet",
                )
            for index, backend in enumerate(patch.backends):
                if backend.HasField("capacity_scaler"):
                    value = backend.capacity_scaler
                    if value != 0 and not 0.1 <= value <= 1.0:
                        raise ApiError(
                            400,
                            f"Invalid value for field 'resource.backends[{index}].capacityScaler'"
                            f": '{value:g}'. Must be 0 or between 0.1 and 1.0.",
                            reason="invalid",
                        )
            if patch.backends and len(patch.backends) == 1:
                only = patch.backends[0]
                if only.HasField("capacity_scaler") and only.capacity_scaler == 0:
                    # Compute API reference, Backend.capacityScaler: "You cannot configure a
                    # setting of 0 when there is only one backend attached to the backend
                    # service."
                    raise ApiError(
                        400,
                        "Invalid value for field 'resource.backends[0].capacityScaler': '0'. "
                        "Cannot set capacityScaler to 0 when there is only one backend.",
                        reason="invalid",
                    )
            merged = BackendService()
            merged.CopyFrom(service)
            for descriptor, value in patch.ListFields():
                if descriptor.name in ("fingerprint", "id", "kind", "self_link", "name"):
                    continue
                merged.ClearField(descriptor.name)
                if descriptor.is_repeated:
                    getattr(merged, descriptor.name).extend(value)
                elif descriptor.message_type is not None:
                    getattr(merged, descriptor.name).CopyFrom(value)
                else:
                    setattr(merged, descriptor.name, value)
            fault = self._take_compute_fault(f"projects/{project}/global/backendServices/{name}")
            now = self.clock()
            op_name = f"operation-{int(time.time() * 1000)}-{os.urandom(6).hex()}"
            pb = ComputeOperation(
                kind="compute#operation",
                id=next(self._serial) + 7000000000000000000,
                name=op_name,
                operation_type="patch",
                target_link=service.self_link,
                target_id=service.id,
                status=_C_RUNNING,
                progress=0,
                user="anonymous",
                insert_time=_rfc3339(),
                start_time=_rfc3339(),
                self_link=f"{COMPUTE_BASE}/projects/{project}/global/operations/{op_name}",
            )
            self.compute_ops[(project, op_name)] = _ComputeOp(
                pb, project, name, merged, now, self.compute_op_seconds, fault, extras
            )
            if request_id:
                self.compute_request_ids[(project, request_id)] = op_name
            self.advance()
            return pb

    # ------------------------------------------------------------------------ engine

    def advance(self) -> None:
        """Moves every operation to where it stands now and applies what finished."""
        with self.lock:
            now = self.clock()
            for op in self.operations.values():
                if op.pb.status != OpStatus.DONE:
                    self._advance_op(op, now)
            for cop in self.compute_ops.values():
                if cop.pb.status != _C_DONE:
                    self._advance_compute(cop, now)

    def _refuse_if_busy(self, project: str, location: str, name: str) -> None:
        # GKE serializes cluster operations: a second one gets HTTP 400, status
        # FAILED_PRECONDITION, in one of GKE's shapes (busy_error; busy_shape), naming the
        # running operation except in the structured form; GKE names one even when several
        # run. Not the concurrent types (google/container/v1 cluster_service.proto,
        # Operation.Type): AUTO_REPAIR_NODES "may be concurrent with other operations",
        # SET_NODE_POOL_MANAGEMENT "may be concurrent with most other operations".
        for op in sorted(self.operations.values(), key=lambda o: o.created):
            if op.pb.operation_type in _CONCURRENT_TYPES:
                continue
            if op.key == (project, location, name) and op.pb.status != OpStatus.DONE:
                raise busy_error(self.busy_shape, op.pb.name, name)

    def _take_upgrade_fault(self, op_type: int, cluster_id: str) -> UpgradeFault | None:
        for fault in self.upgrade_faults:
            if fault.op_type == op_type and fault.cluster == cluster_id and fault.remaining > 0:
                fault.remaining -= 1
                return fault
        return None

    def _take_compute_fault(self, service: str) -> ComputeFault | None:
        for fault in self.compute_faults:
            if fault.backend_service == service and fault.remaining > 0:
                fault.remaining -= 1
                return fault
        return None

    def _start(
        self,
        op_type: int,
        project: str,
        location: str,
        cluster: Any,
        pool: str,
        target: str,
        node: str = "",
    ) -> Any:
        name = f"operation-{int(time.time() * 1000)}-{os.urandom(4).hex()}"
        link = f"{CONTAINER_BASE}/{_link_path(self.project_number(project), location)}"
        target_link = f"{link}/clusters/{cluster.name}" + (f"/nodePools/{pool}" if pool else "")
        if node:
            target_link += f"/node/{node}"
        pb = GkeOperation(
            name=name,
            zone=location,
            location=location,
            operation_type=op_type,
            status=OpStatus.PENDING,
            self_link=f"{link}/operations/{name}",
            target_link=target_link,
            start_time=_rfc3339(),
        )
        cluster_id = f"projects/{project}/locations/{location}/clusters/{cluster.name}"
        fault = self._take_upgrade_fault(op_type, cluster_id)
        nodes = 0
        if pool:
            found = next(p for p in cluster.node_pools if p.name == pool)
            nodes = max(1, found.initial_node_count) * max(1, len(found.locations) or 1)
        timing = self.op_timing.get(op_type, OpTiming())
        if pool and op_type == OpType.UPGRADE_NODES:
            soak = _blue_green_soak(found, nodes) * self.soak_scale
            timing = OpTiming(timing.pending, timing.running + soak)
        op = _Op(
            pb, project, location, cluster.name, pool, target, self.clock(), timing, fault, nodes
        )
        self.operations[(project, location, name)] = op
        self._advance_op(op, op.created)
        return pb

    def _advance_op(self, op: _Op, now: float) -> None:
        cluster = self.clusters.get(op.key)
        pool = None
        if cluster is not None and op.pool:
            pool = next((p for p in cluster.node_pools if p.name == op.pool), None)
        elapsed = now - op.created
        if op.cancel_at is not None:
            if now - op.cancel_at < self.abort_seconds:
                op.pb.status = OpStatus.ABORTING
                return
            self._finish(op, cluster, pool, (_CODE_CANCELLED, "Operation was cancelled."))
            return
        if elapsed < op.timing.pending:
            op.pb.status = OpStatus.PENDING
            return
        if elapsed < op.timing.pending + op.timing.running:
            fraction = (elapsed - op.timing.pending) / max(op.timing.running, 1e-9)
            op.pb.status = OpStatus.RUNNING
            self._progress(op, fraction)
            if cluster is not None:
                cluster.status = ClusterStatus.RECONCILING
                cluster.status_message = ""
            if pool is not None:
                pool.status = PoolStatus.RECONCILING
            return
        fault = op.fault
        self._finish(op, cluster, pool, (fault.code, fault.message) if fault else None)

    def _progress(self, op: _Op, fraction: float) -> None:
        progress = op.pb.progress
        del progress.metrics[:]
        if op.pool:
            done = min(op.nodes_total, int(op.nodes_total * fraction))
            progress.metrics.add(name="nodes done", int_value=done)
            progress.metrics.add(name="nodes total", int_value=op.nodes_total)
        else:
            progress.metrics.add(name="progress", double_value=round(min(fraction, 1.0), 3))
            progress.metrics.add(name="progress scale", double_value=1.0)

    def _finish(self, op: _Op, cluster: Any, pool: Any, error: tuple[int, str] | None) -> None:
        op.pb.status = OpStatus.DONE
        op.pb.end_time = _rfc3339()
        if error is None:
            self._progress(op, 1.0)
            if cluster is not None and not op.applied and op.target:  # repairs keep versions
                if op.pool and pool is not None:
                    pool.version = op.target
                elif not op.pool:
                    cluster.current_master_version = op.target
                op.applied = True
        else:
            op.pb.error.code = error[0]
            op.pb.error.message = error[1]
            op.pb.status_message = error[1]
        if pool is not None:
            pool.status = PoolStatus.RUNNING
        if cluster is not None:
            cluster.status = ClusterStatus.RUNNING
            cluster.status_message = ""
            _refresh_node_version(cluster)

    def _advance_compute(self, op: _ComputeOp, now: float) -> None:
        elapsed = now - op.created
        if elapsed < op.seconds:
            op.pb.status = _C_RUNNING
            op.pb.progress = int(100 * elapsed / max(op.seconds, 1e-9))
            return
        op.pb.status = _C_DONE
        op.pb.progress = 100
        op.pb.end_time = _rfc3339()
        if op.fault is not None:
            op.pb.error.errors.add(code=op.fault.code, message=op.fault.message)
            op.pb.http_error_status_code = 500
            op.pb.http_error_message = "INTERNAL SERVER ERROR"
            return
        key = (op.project, op.service)
        if key in self.controlled:
            # The owning controller reconciles right away: capacity scalers back as they were.
            before = {b.group: b for b in self.backend_services[key].backends}
            for backend in op.patched.backends:
                if backend.group in before:
                    backend.capacity_scaler = before[backend.group].capacity_scaler
        op.patched.fingerprint = _fingerprint()
        self.backend_services[key] = op.patched
        if op.extras is not None:
            self.backend_extras[key] = op.extras


NEWER_BACKEND_FIELDS = frozenset({"futureBalancingHint"})
"""Stands for any Backend field compute has that the pinned client does not know yet."""

_C_DONE = compute_v1.Operation.Status.DONE.value
_C_RUNNING = compute_v1.Operation.Status.RUNNING.value


def _link_path(project: str, location: str) -> str:
    # GKE's links name zonal resources under zones/ and regional ones under locations/.
    kind = "zones" if re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", location) else "locations"
    return f"projects/{project}/{kind}/{location}"


def _fingerprint() -> str:
    return base64.b64encode(os.urandom(8)).decode("ascii")


def _rfc3339(at: datetime | None = None) -> str:
    moment = at or datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def _refresh_node_version(cluster: Any) -> None:
    pools = [p.version for p in cluster.node_pools if p.version]
    if pools:
        cluster.current_node_version = min(pools, key=versions.parse)


# ------------------------------------------------------------------ builders for tests


def build_cluster(
    name: str,
    *,
    master_version: str,
    node_pools: Iterable[Mapping[str, Any]] = (),
    status: str = "RUNNING",
    status_message: str = "",
    labels: Mapping[str, str] | None = None,
    channel: str = "",
    exclusions: Iterable[Mapping[str, Any]] = (),
    autopilot: bool = False,
    window: Mapping[str, Any] | None = None,
) -> Any:
    """A Cluster message from plain values (pools: name, version, imageType, nodes, upgrade;
    window: {"daily": "03:00"} or {"start", "end" (datetimes), "recurrence" (RRULE)})."""
    cluster = Cluster(
        name=name,
        initial_cluster_version=master_version,
        current_master_version=master_version,
        status=ClusterStatus[status],
        status_message=status_message,
        endpoint="203.0.113.10",
        create_time=_rfc3339(datetime(2024, 1, 1, tzinfo=UTC)),
    )
    cluster.resource_labels.update(labels or {})
    if channel:
        cluster.release_channel.channel = Channel[channel]
    for spec in node_pools:
        pool = cluster.node_pools.add(
            name=spec["name"],
            version=spec.get("version", master_version),
            status=PoolStatus[spec.get("status", "RUNNING")],
            initial_node_count=int(spec.get("nodes", 3)),
        )
        pool.config.image_type = spec.get("imageType", "COS_CONTAINERD")
        pool.config.machine_type = spec.get("machineType", "e2-standard-4")
        pool.management.auto_upgrade = bool(spec.get("autoUpgrade", False))
        pool.management.auto_repair = True
        upgrade = spec.get("upgradeSettings", {"maxSurge": 1, "maxUnavailable": 0})
        json_format.ParseDict(upgrade, pool.upgrade_settings)
    for exclusion in exclusions:
        excluded = cluster.maintenance_policy.window.maintenance_exclusions[exclusion["name"]]
        excluded.start_time.FromDatetime(exclusion["start"])
        if exclusion.get("end") is not None:  # absent: UNTIL_END_OF_SUPPORT with no end given
            excluded.end_time.FromDatetime(exclusion["end"])
        if "scope" in exclusion:
            excluded.maintenance_exclusion_options.scope = Scope[exclusion["scope"]]
        if "endTimeBehavior" in exclusion:
            # google/container/v1/cluster_service.proto MaintenanceExclusionOptions.
            behavior = EndTimeBehavior[exclusion["endTimeBehavior"]]
            excluded.maintenance_exclusion_options.end_time_behavior = behavior
    if autopilot:
        # Autopilot clusters are always in a release channel (release-channels docs).
        cluster.autopilot.enabled = True
        if not channel:
            cluster.release_channel.channel = Channel.REGULAR
    policy = cluster.maintenance_policy.window
    if window and "daily" in window:
        policy.daily_maintenance_window.start_time = window["daily"]
        policy.daily_maintenance_window.duration = "PT4H0M0S"  # output only; GKE picks 4 h
    elif window:
        policy.recurring_window.window.start_time.FromDatetime(window["start"])
        policy.recurring_window.window.end_time.FromDatetime(window["end"])
        policy.recurring_window.recurrence = window["recurrence"]
    if exclusions or window:
        cluster.maintenance_policy.resource_version = "e3b0c442"
    return cluster


def build_server_config(
    *,
    master_versions: Sequence[str],
    node_versions: Sequence[str] | None = None,
    default: str = "",
    channels: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """A ServerConfig: valid master/node versions and, per channel name, its valid versions."""
    ordered = sorted(master_versions, key=versions.parse, reverse=True)
    nodes = sorted(node_versions or master_versions, key=versions.parse, reverse=True)
    config = ServerConfig(
        default_cluster_version=default or (ordered[-1] if ordered else ""),
        valid_master_versions=ordered,
        valid_node_versions=nodes,
        default_image_type="COS_CONTAINERD",
        valid_image_types=["COS_CONTAINERD", "UBUNTU_CONTAINERD"],
    )
    for channel_name, valid in (channels or {}).items():
        chosen = sorted(valid, key=versions.parse, reverse=True)
        config.channels.add(
            channel=Channel[channel_name],
            default_version=chosen[-1] if chosen else "",
            valid_versions=chosen,
            upgrade_target_version=chosen[0] if chosen else "",
        )
    return config


def build_backend_service(name: str, backends: Iterable[Mapping[str, Any]]) -> Any:
    """A global BackendService with these backends (group, capacityScaler, balancingMode...)."""
    service = BackendService(
        name=name,
        load_balancing_scheme="EXTERNAL_MANAGED",
        protocol="HTTP",
        port_name="http",
        timeout_sec=30,
        creation_timestamp=_rfc3339(datetime(2024, 1, 1, tzinfo=UTC) - timedelta(days=1)),
    )
    for spec in backends:
        json_format.ParseDict(
            {"balancingMode": "RATE", "maxRatePerEndpoint": 100, "capacityScaler": 1.0, **spec},
            service.backends.add(),
        )
    return service


def _blue_green_soak(pool: Any, nodes: int) -> float:
    """Seconds a blue-green upgrade of the pool spends soaking, inside its one UPGRADE_NODES
    operation (GKE documentation, "Node upgrade strategies", blue-green phases: the blue pool
    is drained in batches with `batchSoakDuration` after each, default zero per
    cluster_service.proto, then soaks `nodePoolSoakDuration`, one hour when unset, before it is
    deleted). A surge upgrade does not soak."""
    settings = pool.upgrade_settings
    if settings.strategy != NodePoolUpdateStrategy.BLUE_GREEN:
        return 0.0
    blue_green = settings.blue_green_settings
    rollout = blue_green.standard_rollout_policy
    size = rollout.batch_node_count or math.ceil(nodes * (rollout.batch_percentage or 1.0))
    drains = math.ceil(nodes / max(1, size))
    final = (
        blue_green.node_pool_soak_duration.ToTimedelta().total_seconds()
        if blue_green.HasField("node_pool_soak_duration")
        else 3600.0
    )
    return drains * rollout.batch_soak_duration.ToTimedelta().total_seconds() + final
