"""A GKE API emulator for tests: the container v1 and compute v1 REST endpoints the GKE plugin
uses, served on loopback in the documented wire format, with long-running operations.

The official clients talk to it unchanged:

    ClusterManagerClient(credentials=AnonymousCredentials(), transport="rest",
                         client_options={"api_endpoint": emulator.endpoint})

What it serves (all under /v1/projects/P/locations/L, L may be "-" for lists):
clusters list/get, nodePools list/get, clusters/C:updateMaster, PUT nodePools/NP
(UpdateNodePool), operations list/get/cancel, serverConfig; and compute
projects/P/global/backendServices/NAME get/patch (fingerprint, requestId) and
projects/P/global/operations/OP get. Operations go PENDING → RUNNING → DONE on the clock with
progress metrics, may be failed or cancelled (ABORTING → DONE with error), and change the
cluster (status RECONCILING while running, versions at DONE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from google.protobuf import json_format

from tests.support.gke_emulator._http import EmulatorServer
from tests.support.gke_emulator._model import (
    NEWER_BACKEND_FIELDS,
    ApiError,
    ClusterStatus,
    ComputeFault,
    EmulatorState,
    OpTiming,
    OpType,
    Quota,
    UpgradeFault,
    build_backend_service,
    build_cluster,
    build_server_config,
    busy_error,
)

__all__ = [
    "NEWER_BACKEND_FIELDS",
    "ApiError",
    "GkeEmulator",
    "OpTiming",
    "gke_emulator",
    "split_cluster_id",
]


def split_cluster_id(cluster_id: str) -> tuple[str, str, str]:
    """(project, location, name) of projects/P/locations/L/clusters/C."""
    parts = cluster_id.split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations":
        raise ValueError(f"{cluster_id!r} is not projects/P/locations/L/clusters/C")
    return parts[1], parts[3], parts[5]


class GkeEmulator:
    """The emulator: a state and its HTTP server. Use as a context manager or start()/stop()."""

    def __init__(
        self,
        *,
        master_seconds: OpTiming | None = None,
        nodes_seconds: OpTiming | None = None,
        compute_op_seconds: float = 0.2,
        soak_scale: float = 1.0,
        port: int = 0,
    ) -> None:
        self.state = EmulatorState(compute_op_seconds=compute_op_seconds, soak_scale=soak_scale)
        if master_seconds is not None:
            self.state.op_timing[OpType.UPGRADE_MASTER] = master_seconds
        if nodes_seconds is not None:
            self.state.op_timing[OpType.UPGRADE_NODES] = nodes_seconds
        self._server = EmulatorServer(self.state, port=port)

    @property
    def endpoint(self) -> str:
        """http://127.0.0.1:PORT: the api_endpoint for both the container and compute clients."""
        return self._server.endpoint

    def start(self) -> GkeEmulator:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> GkeEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------ set-up

    def set_timing(self, op_type: str, pending: float, running: float) -> None:
        """Durations of future operations of a type ("UPGRADE_MASTER" or "UPGRADE_NODES")."""
        with self.state.lock:
            self.state.op_timing[OpType[op_type]] = OpTiming(pending, running)

    def set_server_config(
        self,
        project: str,
        location: str,
        *,
        master_versions: Sequence[str],
        node_versions: Sequence[str] | None = None,
        channels: Mapping[str, Sequence[str]] | None = None,
        default: str = "",
    ) -> None:
        """The versions GetServerConfig offers in a location (zones inherit their region's)."""
        config = build_server_config(
            master_versions=master_versions,
            node_versions=node_versions,
            channels=channels,
            default=default,
        )
        self.state.set_server_config(project, location, config)

    def add_cluster(
        self,
        cluster_id: str,
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
    ) -> str:
        """Adds a cluster; node_pools items: name, version, imageType, nodes, upgradeSettings,
        status; exclusions items: name, start, end (datetimes; None with endTimeBehavior
        UNTIL_END_OF_SUPPORT), scope, endTimeBehavior; window: {"daily":
        "HH:MM"} or {"start", "end", "recurrence"}; autopilot: an Autopilot cluster."""
        project, location, name = split_cluster_id(cluster_id)
        cluster = build_cluster(
            name,
            master_version=master_version,
            node_pools=node_pools,
            status=status,
            status_message=status_message,
            labels=labels,
            channel=channel,
            exclusions=exclusions,
            autopilot=autopilot,
            window=window,
        )
        self.state.add_cluster(cluster, project, location)
        return cluster_id

    def set_cluster_status(self, cluster_id: str, status: str, message: str = "") -> None:
        """Sets a cluster's status (RUNNING, RECONCILING, DEGRADED, ERROR...) and message."""
        with self.state.lock:
            cluster = self.state.cluster(*split_cluster_id(cluster_id))
            cluster.status = ClusterStatus[status]
            cluster.status_message = message

    def add_backend_service(
        self,
        project: str,
        name: str,
        backends: Iterable[Mapping[str, Any]],
        *,
        owner: str = "",
        controlled: bool = False,
    ) -> None:
        """A global backend service; backends items in compute JSON (group, capacityScaler...,
        and fields newer than the pinned client, see NEWER_BACKEND_FIELDS); owner: the
        orchestrationInfo.resourceUri of the controller that manages it (it then reverts every
        capacityScaler change, as does controlled=True without saying so)."""
        items = [dict(b) for b in backends]
        extras = {
            str(b.get("group", "")): {k: b.pop(k) for k in list(b) if k in NEWER_BACKEND_FIELDS}
            for b in items
        }
        service = build_backend_service(name, items)
        if owner:
            service.orchestration_info.resource_uri = owner
        self.state.add_backend_service(
            project,
            service,
            {g: e for g, e in extras.items() if e},
            controlled=controlled or bool(owner),
        )

    def controller_sync(self, project: str, name: str, capacity: float = 1.0) -> None:
        """A controller that owns the service's capacity (a GKE Ingress or autoneg sync, which
        runs on its own schedule, long after a drain was read back) sets every backend's
        capacityScaler to `capacity`, descriptions kept, with a new fingerprint."""
        with self.state.lock:
            service = self.state.backend_services[(project, name)]
            for backend in service.backends:
                backend.capacity_scaler = capacity
            service.fingerprint = f"sync-{len(self.state.requests)}-{capacity:g}"

    def remove_backend_service(self, project: str, name: str) -> None:
        """Deletes a backend service (compute then answers 404 for it)."""
        with self.state.lock:
            del self.state.backend_services[(project, name)]

    def miss_zones(self, zones: Iterable[str], times: int = 1) -> None:
        """The next `times` ListOperations answers cannot reach these zones: their operations
        are left out and the zones named in missingZones."""
        with self.state.lock:
            self.state.missing_zones.extend(set(zones) for _ in range(times))

    def fail_next_upgrade(
        self, op_type: str, cluster_id: str, message: str, *, code: int = 13, times: int = 1
    ) -> None:
        """The next `times` operations of op_type on the cluster end DONE with this error."""
        with self.state.lock:
            self.state.upgrade_faults.append(
                UpgradeFault(OpType[op_type], cluster_id, message, code, times)
            )

    def fail_next_patch(self, project: str, name: str, message: str) -> None:
        """The next PATCH of the backend service ends DONE with an error, unapplied."""
        with self.state.lock:
            self.state.compute_faults.append(
                ComputeFault(f"projects/{project}/global/backendServices/{name}", message)
            )

    def fail_http(
        self,
        method: str,
        code: int,
        message: str,
        status: str = "",
        times: int = 1,
        *,
        reason: str = "",
    ) -> None:
        """The next calls of method (e.g. "ListClusters", "UpdateMaster") answer an HTTP error
        (reason: the errors[].reason Google adds, e.g. failedPrecondition)."""
        self.state.fail_http(method, ApiError(code, message, status, reason=reason), times)

    def before_next_call(self, method: str, hook: Callable[[], object]) -> None:
        """Runs hook once, just before the next call of method is answered (e.g. an
        auto-upgrade GKE starts between the plugin's ListOperations and its UpdateMaster)."""
        with self.state.lock:
            self.state.before_call.setdefault(method, []).append(hook)

    def set_busy_shape(self, shape: str) -> None:
        """How GKE refuses an operation on a busy cluster from now on: "incompatible"
        (default), "upgrading", "operating" or "reason" (see _model.busy_error)."""
        busy_error(shape, "operation-0", "c")  # ValueError for an unknown shape
        with self.state.lock:
            self.state.busy_shape = shape

    def set_quota(self, api: str, calls: int, per_seconds: float = 60.0) -> None:
        """A rate quota: at most `calls` calls of api ("compute" or "container") per
        `per_seconds`; more answer the API's rate-limit error (_model.quota_error)."""
        if api not in ("compute", "container"):
            raise ValueError(f"api {api!r}: compute or container")
        with self.state.lock:
            self.state.quotas[api] = Quota(calls, per_seconds)

    def clear_quotas(self) -> None:
        with self.state.lock:
            self.state.quotas.clear()

    def clear_http_faults(self) -> None:
        """Forgets every pending fail_http."""
        with self.state.lock:
            self.state.http_faults.clear()

    def start_foreign_operation(
        self,
        cluster_id: str,
        op_type: str,
        target: str,
        node_pool: str = "",
        *,
        node: str = "",
        concurrent: bool = False,
    ) -> str:
        """Starts an operation nobody asked the API for (an auto-upgrade; with node, an
        auto-repair of that node, target ""); returns its id. concurrent: beside a running
        operation (GKE's own maintenance may overlap)."""
        project, location, name = split_cluster_id(cluster_id)
        op = self.state.start_foreign_operation(
            OpType[op_type], project, location, name, node_pool, target, node, concurrent
        )
        return f"projects/{project}/locations/{location}/operations/{op.name}"

    def cancel(self, operation_id: str) -> None:
        """Cancels an operation by projects/P/locations/L/operations/OP."""
        parts = operation_id.split("/")
        self.state.cancel_operation(parts[1], parts[3], parts[5])

    # ------------------------------------------------------------------------- reads

    def calls(self, method: str) -> int:
        """How many requests of a method ("UpdateMaster", "compute.backendServices.patch"...)."""
        with self.state.lock:
            return self.state.calls[method]

    def requests(self, method: str) -> list[dict[str, Any]]:
        """The JSON bodies of the requests of a method, oldest first."""
        with self.state.lock:
            return [body for name, _, body in self.state.requests if name == method]

    def authorizations(self) -> list[str]:
        """The Authorization header of every request ("" when none was sent)."""
        with self.state.lock:
            return list(self.state.authorizations)

    def cluster(self, cluster_id: str) -> dict[str, Any]:
        """The cluster as GetCluster answers it (JSON, enums by name)."""
        with self.state.lock:
            found = self.state.cluster(*split_cluster_id(cluster_id))
            return dict(json_format.MessageToDict(found))

    def operations(self, cluster_id: str | None = None) -> list[dict[str, Any]]:
        """Every container operation (of one cluster), oldest first, as JSON."""
        with self.state.lock:
            self.state.advance()
            found = []
            for op in sorted(self.state.operations.values(), key=lambda o: o.created):
                key = f"projects/{op.project}/locations/{op.location}/clusters/{op.cluster}"
                if cluster_id is None or key == cluster_id:
                    found.append(dict(json_format.MessageToDict(op.pb)))
            return found

    def backend_service(self, project: str, name: str) -> dict[str, Any]:
        """The backend service as compute answers it (JSON, newer fields included)."""
        return self.state.backend_service_json(project, name)

    def capacity(self, project: str, name: str, group: str) -> float | None:
        """The capacityScaler of the backend whose group ends with `group`, if any."""
        for backend in self.backend_service(project, name).get("backends", []):
            if str(backend.get("group", "")).endswith(group):
                return float(backend.get("capacityScaler", 0.0))
        return None


@contextmanager
def gke_emulator(**options: Any) -> Iterator[GkeEmulator]:
    """A started emulator, stopped on exit."""
    emulator = GkeEmulator(**options)
    with emulator:
        yield emulator
