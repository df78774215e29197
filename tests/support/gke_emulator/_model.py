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
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import compute_v1, container_v1
from google.protobuf import json_format

from plugins.sdk import versions

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
Channel = container_v1.ReleaseChannel.Channel

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

    def __init__(self, http_code: int, message: str, status: str = "", *, reason: str = "") -> None:
        super().__init__(message)
        self.http_code = http_code
        self.message = message
        self.status = status or self._STATUS_BY_CODE.get(http_code, "UNKNOWN")
        self.reason = reason  # compute's errors[].reason, e.g. conditionNotMet


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

    def add_backend_service(self, project: str, service: Any) -> None:
        with self.lock:
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

    def take_http_fault(self, method: str) -> ApiError | None:
        with self.lock:
            queue = self.http_faults.get(method)
            return queue.pop(0) if queue else None

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

    def list_operations(self, project: str, location: str) -> list[Any]:
        with self.lock:
            self.advance()
            found = [
                op
                for op in self.operations.values()
                if op.project == project and location in ("-", op.location)
            ]
            return [op.pb for op in sorted(found, key=lambda o: o.created)]

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
            offered = _master_versions(config, cluster)
            target = _resolve(wanted, offered, default=_default_master(config, cluster))
            if target is None:
                raise ApiError(400, f'Master version "{wanted}" is unsupported.')
            current = cluster.current_master_version
            if versions.is_newer(current, target):
                raise ApiError(
                    400,
                    f'Master version "{target}" is older than the current master version '
                    f'"{current}"; downgrades are not supported.',
                )
            cur, new = versions.parse(current), versions.parse(target)
            if new.major == cur.major and new.minor > cur.minor + 1:
                raise ApiError(
                    400,
                    f"Master cannot be upgraded from {current} to {target}: upgrade one minor "
                    "version at a time.",
                )
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
            master = cluster.current_master_version
            config = self.server_config(project, location)
            offered = sorted(
                {*config.valid_node_versions, master}, key=versions.parse, reverse=True
            )
            offered = [v for v in offered if not versions.is_newer(v, master)]
            target = _resolve(wanted, offered, default=master)
            if target is None:
                if versions.is_newer(wanted, master):
                    raise ApiError(
                        400,
                        f'Node version "{wanted}" must not be newer than the master version '
                        f'"{master}".',
                    )
                raise ApiError(400, f'Node version "{wanted}" is unsupported.')
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
        self, op_type: int, project: str, location: str, name: str, pool: str, target: str
    ) -> Any:
        """An operation nobody asked the API for (e.g. an auto-upgrade)."""
        with self.lock:
            cluster = self.cluster(project, location, name)
            self._refuse_if_busy(project, location, name)
            return self._start(op_type, project, location, cluster, pool, target)

    def patch_backend_service(self, project: str, name: str, patch: Any, request_id: str) -> Any:
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
                pb, project, name, merged, now, self.compute_op_seconds, fault
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
        for op in self.operations.values():
            if op.key == (project, location, name) and op.pb.status != OpStatus.DONE:
                raise ApiError(
                    400,
                    f"Cluster is running incompatible operation {op.pb.name}.",
                    "FAILED_PRECONDITION",
                )

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
        self, op_type: int, project: str, location: str, cluster: Any, pool: str, target: str
    ) -> Any:
        name = f"operation-{int(time.time() * 1000)}-{os.urandom(4).hex()}"
        link = f"{CONTAINER_BASE}/{_link_path(self.project_number(project), location)}"
        target_link = f"{link}/clusters/{cluster.name}" + (f"/nodePools/{pool}" if pool else "")
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
            if cluster is not None and not op.applied:
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
        op.patched.fingerprint = _fingerprint()
        self.backend_services[(op.project, op.service)] = op.patched


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


def _master_versions(config: Any, cluster: Any) -> list[str]:
    channel = cluster.release_channel.channel
    if channel != Channel.UNSPECIFIED:
        for entry in config.channels:
            if entry.channel == channel:
                return list(entry.valid_versions)
        return []
    return list(config.valid_master_versions)


def _default_master(config: Any, cluster: Any) -> str:
    channel = cluster.release_channel.channel
    if channel != Channel.UNSPECIFIED:
        for entry in config.channels:
            if entry.channel == channel:
                return str(entry.default_version)
    return str(config.default_cluster_version)


def _resolve(wanted: str, offered: Sequence[str], default: str) -> str | None:
    """GKE's version aliases: "-" default, "latest", "1.X", "1.X.Y", or an exact version."""
    ordered = sorted(offered, key=versions.parse, reverse=True)
    if wanted == "-":
        return default or None
    if wanted == "latest":
        return ordered[0] if ordered else None
    if wanted in offered:
        return wanted
    if re.fullmatch(r"\d+\.\d+(\.\d+)?", wanted):
        prefix = wanted + ("." if wanted.count(".") == 1 else "-")
        for candidate in ordered:
            if candidate.startswith(prefix):
                return candidate
    return None


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
) -> Any:
    """A Cluster message from plain values (pools: name, version, imageType, nodes, upgrade)."""
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
        window = cluster.maintenance_policy.window.maintenance_exclusions[exclusion["name"]]
        window.start_time.FromDatetime(exclusion["start"])
        window.end_time.FromDatetime(exclusion["end"])
        if "scope" in exclusion:
            window.maintenance_exclusion_options.scope = Scope[exclusion["scope"]]
    if exclusions:
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
