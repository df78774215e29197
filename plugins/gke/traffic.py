"""Service-out and service-in: drain a cluster by setting its backends' capacityScaler to 0 in
the configured global backend services (remembering the old value in the backend's
description), restore it afterwards; or, in mode none, only record the state."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from google.cloud import compute_v1

from plugins.gke.api import ComputeBusy, GkeApi, JsonObject, RateLimited
from plugins.gke.config import BackendServiceRef, TrafficConfig
from plugins.gke.ids import group_key
from plugins.gke.state import PluginState
from plugins.sdk import FailedPrecondition, NotFound, PluginError, Unavailable

__all__ = [
    "DRAIN_MARKER",
    "BackendServiceTraffic",
    "NoTraffic",
    "ServiceState",
    "Stopping",
    "Traffic",
    "TrafficError",
    "build_traffic",
]

DRAIN_MARKER = "fleetupgrade.io/capacity-scaler-before-drain"
"""Key of the note the plugin appends to a drained backend's description: [KEY=VALUE]."""

_MARKER = re.compile(r"\s*\[" + re.escape(DRAIN_MARKER) + r"=([0-9.eE+-]+)\]")
_DEFAULT_SCALER = 1.0  # compute's default capacityScaler
_PATCH_ATTEMPTS = 6
_COMPUTE_OP_TIMEOUT = 600.0
_LOG = logging.getLogger("plugins.gke.traffic")

Progress = Callable[[int], None]


class TrafficError(PluginError):
    """Draining or restoring failed in compute (the operation fails with this message)."""


class Stopping(Exception):
    """The plugin is stopping: the work is left in flight, to resume after a restart."""


class ServiceState(NamedTuple):
    """A cluster's service state: in service or not, and why it cannot serve when known
    (problem: e.g. its backend service is gone; the cluster then counts as unavailable)."""

    in_service: bool
    problem: str = ""


class Traffic(Protocol):
    """How a cluster is taken out of and put back into service."""

    def in_service(self, cluster_ids: list[str]) -> dict[str, ServiceState]:
        """Each cluster's service state now; never fails for the whole list because of one
        missing backend service."""
        ...

    def needs_out(self, cluster_id: str) -> bool:
        """True when ServiceOut has work to do (FailedPrecondition when it cannot)."""
        ...

    def needs_in(self, cluster_id: str) -> bool:
        """True when ServiceIn has work to do."""
        ...

    def service_out(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        """Drains the cluster; blocks until done; TrafficError/PluginError on failure."""
        ...

    def service_in(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        """Restores the cluster's traffic; blocks until done."""
        ...

    @property
    def immediate(self) -> bool:
        """True when service changes take effect at once (no operation runs)."""
        ...


class NoTraffic:
    """Mode none: nothing to drain; the service state is the plugin's own record."""

    immediate = True

    def __init__(self, state: PluginState) -> None:
        self._state = state

    def in_service(self, cluster_ids: list[str]) -> dict[str, ServiceState]:
        out = self._state.out_of_service()
        return {c: ServiceState(c not in out) for c in cluster_ids}

    def needs_out(self, cluster_id: str) -> bool:
        return cluster_id not in self._state.out_of_service()

    def needs_in(self, cluster_id: str) -> bool:
        return cluster_id in self._state.out_of_service()

    def service_out(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        self._state.set_out_of_service(cluster_id, True)

    def service_in(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        self._state.set_out_of_service(cluster_id, False)


Backend = dict[str, Any]


def _scaler(backend: Backend) -> float:
    return float(backend.get("capacityScaler", _DEFAULT_SCALER))


def _with_marker(description: str, previous: float) -> str:
    base = _MARKER.sub("", description)
    note = f"[{DRAIN_MARKER}={previous:g}]"
    return f"{base} {note}" if base else note


def _marker_value(description: str) -> float | None:
    match = _MARKER.search(description)
    if not match:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def _service_path(ref: BackendServiceRef) -> str:
    return f"projects/{ref.project}/global/backendServices/{ref.name}"


def _owner(service: JsonObject, backends: list[Backend]) -> str:
    """Who manages the backend service (compute's orchestrationInfo.resourceUri), if anyone."""
    for holder in (service, *backends):
        info = holder.get("orchestrationInfo")
        if isinstance(info, dict):
            return str(info.get("resourceUri") or "another controller")
    return ""


class BackendServiceTraffic:
    """Mode backendServices: capacityScaler 0 on the cluster's backends drains it.

    Backend services are read and written as compute's JSON: a patch sends `backends` (the
    whole list, as JSON merge patch requires) exactly as read except for the changed
    capacityScaler and description, plus the fingerprint; so fields newer than the pinned
    client survive. Compute's own rules are checked first (capacityScaler 0 is refused on a
    service with a single backend; a service owned by a controller is refused), and each change
    is read back after compute reports it done.
    """

    immediate = False

    def __init__(
        self,
        api: GkeApi,
        services: list[BackendServiceRef],
        backends: Mapping[str, list[str]],
        max_poll_seconds: float = 2.0,
        stop: threading.Event | None = None,
        allow_zero_capacity: bool = False,
    ) -> None:
        self._api = api
        self._allow_zero = allow_zero_capacity
        self._stop = stop if stop is not None else threading.Event()
        self._services = services
        self._groups = {cid: {group_key(g) for g in groups} for cid, groups in backends.items()}
        self._max_poll = max_poll_seconds
        self._locks = {(s.project, s.name): threading.Lock() for s in services}

    def _backends_of(self, cluster_id: str, service: JsonObject) -> list[Backend]:
        groups = self._groups.get(cluster_id, set())
        return [
            b for b in service.get("backends", []) if group_key(str(b.get("group", ""))) in groups
        ]

    def _read_all(self) -> tuple[dict[BackendServiceRef, JsonObject], list[BackendServiceRef]]:
        """(services that answered, services compute does not know): a 404 for one service
        (deleted, or a regional service configured as global) is not an error of the others."""
        found: dict[BackendServiceRef, JsonObject] = {}
        missing: list[BackendServiceRef] = []
        for ref in self._services:
            try:
                found[ref] = self._api.get_backend_service(ref.project, ref.name)
            except NotFound:
                missing.append(ref)
        return found, missing

    def _unplaced(
        self, cluster_id: str, services: Mapping[BackendServiceRef, JsonObject]
    ) -> list[str]:
        """The cluster's configured groups found in none of the services."""
        seen = {
            group_key(str(b.get("group", "")))
            for service in services.values()
            for b in service.get("backends", [])
        }
        return sorted(self._groups.get(cluster_id, set()) - seen)

    @staticmethod
    def _missing_problem(missing: list[BackendServiceRef], unplaced: list[str]) -> str:
        names = ", ".join(_service_path(ref) for ref in missing)
        return (
            f"backend service {names} not found in compute (deleted, or a regional backend "
            f"service: only global ones are supported); the cluster's group "
            f"{', '.join(unplaced)} is in no configured backend service, so its traffic "
            "cannot be known or drained; fix traffic.backendServices / traffic.backends"
        )

    def in_service(self, cluster_ids: list[str]) -> dict[str, ServiceState]:
        services, missing = self._read_all()
        result: dict[str, ServiceState] = {}
        for cluster_id in cluster_ids:
            unplaced = self._unplaced(cluster_id, services) if missing else []
            if unplaced:
                result[cluster_id] = ServiceState(False, self._missing_problem(missing, unplaced))
                continue
            mine = [
                (ref, b) for ref, s in services.items() for b in self._backends_of(cluster_id, s)
            ]
            # Partly drained counts as out: the availability floor must not count it.
            serving = all(_scaler(b) > 0 for _, b in mine)
            undone = [
                f"{_service_path(ref)} {b.get('group')} at {_scaler(b):g}"
                for ref, b in mine
                if _scaler(b) > 0 and _marker_value(str(b.get("description", ""))) is not None
            ]
            if undone:
                # Our drain note is there but the capacity came back: another writer (a GKE
                # Ingress or autoneg controller's next sync) undid the drain after its read-back.
                result[cluster_id] = ServiceState(
                    serving,
                    f"drain undone by another writer: {', '.join(undone)} carries this plugin's "
                    f"{DRAIN_MARKER} note yet serves traffic again; a controller owns this "
                    "service's capacityScaler: shift traffic another way and leave the service "
                    "out of traffic.backendServices",
                )
                continue
            result[cluster_id] = ServiceState(serving)
        return result

    def _plan(self, cluster_id: str, draining: bool) -> list[Backend]:
        """The cluster's backends; FailedPrecondition when it cannot be drained
        or restored (no groups, a missing service holding them, compute's single-backend rule,
        a controller-owned service)."""
        if cluster_id not in self._groups:
            raise FailedPrecondition(
                f"traffic.backends: cluster {cluster_id} has no backend groups configured; add "
                "its instance group or NEG URLs to drain it"
            )
        services, missing = self._read_all()
        unplaced = self._unplaced(cluster_id, services) if missing else []
        if unplaced:
            raise FailedPrecondition(
                f"cluster {cluster_id}: {self._missing_problem(missing, unplaced)}"
            )
        found: list[Backend] = []
        for ref, service in services.items():
            mine = self._backends_of(cluster_id, service)
            if not mine:
                continue
            owner = _owner(service, mine)
            if owner:
                raise FailedPrecondition(
                    f"traffic.backendServices: {_service_path(ref)} is managed by {owner} "
                    "(compute orchestrationInfo); its controller owns capacityScaler and "
                    "would undo a drain (a multi-cluster Gateway does). Shift traffic with the "
                    "HTTPRoute's backendRefs weights instead, and remove this service from "
                    "traffic.backendServices (or use traffic.mode none)"
                )
            if draining and len(service.get("backends", [])) == 1 and _scaler(mine[0]) > 0:
                # Compute API reference, Backend.capacityScaler: "You cannot configure a
                # setting of 0 when there is only one backend attached to the backend service."
                raise FailedPrecondition(
                    f"cluster {cluster_id} is the only backend of {_service_path(ref)}; compute "
                    "refuses capacityScaler 0 on a service with a single backend, and draining "
                    "it would drop all of the service's traffic. Add another cluster's backend "
                    "to the service first, or leave this service out of traffic.backendServices"
                )
            if draining:
                zero = self._zero_capacity(cluster_id, ref, service)
                if zero:
                    raise FailedPrecondition(zero)
            found.extend(mine)
        if not found:
            names = ", ".join(_service_path(ref) for ref in self._services)
            raise FailedPrecondition(
                f"traffic.backends: none of cluster {cluster_id}'s groups is a backend of "
                f"{names}; check the group URLs"
            )
        return found

    def _zero_capacity(self, cluster_id: str, ref: BackendServiceRef, service: JsonObject) -> str:
        """Why draining the cluster would leave the service no serving backend ("" when it
        would not, or when traffic.allowZeroCapacity lets it). A regional cluster's standalone
        NEGs are one backend per zone, so compute's single-backend rule does not catch a
        service whose every backend is the cluster's own; nor one whose other backends are
        drained already (another cluster out of service)."""
        if self._allow_zero:
            return ""
        groups = self._groups.get(cluster_id, set())
        backends = service.get("backends", [])
        serving = [b for b in backends if _scaler(b) > 0]
        others = [b for b in serving if group_key(str(b.get("group", ""))) not in groups]
        if others or not serving:
            return ""  # another backend keeps serving, or nothing of ours serves
        return (
            f"draining cluster {cluster_id} would leave {_service_path(ref)} with no serving "
            f"backend ({len(backends) - len(others)} of its {len(backends)} backends are this "
            "cluster's or drained already): its traffic would be dropped. Service another "
            "cluster back in first, add another cluster's backend to the service, or set "
            "traffic.allowZeroCapacity: true to accept the outage"
        )

    def needs_out(self, cluster_id: str) -> bool:
        return any(_scaler(b) > 0 for b in self._plan(cluster_id, draining=True))

    def needs_in(self, cluster_id: str) -> bool:
        # Drained, or serving again with our note still there (another writer restored it).
        return any(
            _scaler(b) == 0 or _marker_value(str(b.get("description", ""))) is not None
            for b in self._plan(cluster_id, draining=False)
        )

    def service_out(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        self._each_service(cluster_id, request_id, "out", progress)

    def service_in(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        self._each_service(cluster_id, request_id, "in", progress)

    def _each_service(
        self, cluster_id: str, request_id: str, direction: str, progress: Progress
    ) -> None:
        total = len(self._services)
        for index, ref in enumerate(self._services):
            with self._locks[(ref.project, ref.name)]:
                self._patch_one(cluster_id, request_id, direction, ref)
            progress(int(100 * (index + 1) / total))

    def _pause(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise Stopping

    def _read(self, ref: BackendServiceRef) -> JsonObject | None:
        try:
            return self._api.get_backend_service(ref.project, ref.name)
        except NotFound:
            return None  # _plan accepted it: the cluster's groups are all in other services

    def _patch_one(
        self, cluster_id: str, request_id: str, direction: str, ref: BackendServiceRef
    ) -> None:
        limited: RateLimited | None = None
        for attempt in range(_PATCH_ATTEMPTS):
            if self._stop.is_set():
                raise Stopping
            try:
                self._change_one(cluster_id, request_id, direction, ref, attempt)
                return
            except _Retry:
                continue
            except RateLimited as exc:  # Compute's rate quota: wait, then try again
                limited = exc
                self._pause(exc.retry_after or min(0.5 * 2**attempt, 10.0))
        if limited is not None:
            raise limited
        raise Unavailable(
            f"backend service {_service_path(ref)} kept changing under the plugin; retry"
        )

    def _change_one(
        self, cluster_id: str, request_id: str, direction: str, ref: BackendServiceRef, attempt: int
    ) -> None:
        """One read-modify-write of the service; _Retry after a stale fingerprint (paused)."""
        service = self._read(ref)
        if service is None:
            return
        if direction == "out":
            # Read under the service's lock: drains of other clusters since `_plan` count.
            zero = self._zero_capacity(cluster_id, ref, service)
            if zero:
                raise TrafficError(zero)
        groups = self._groups.get(cluster_id, set())
        changed = False
        backends: list[Backend] = []
        for raw in service.get("backends", []):
            backend = dict(raw)  # every field as read, newer ones included
            if group_key(str(backend.get("group", ""))) in groups:
                changed |= _drain(backend) if direction == "out" else _restore(backend)
            backends.append(backend)
        if not changed:
            return
        # A UUID per (request, service, attempt): a repeat after a crash returns the same
        # compute operation instead of patching twice.
        compute_request = str(
            uuid.uuid5(
                uuid.NAMESPACE_URL,
                f"fleetupgrade:{request_id}:{ref.project}/{ref.name}:{direction}:{attempt}",
            )
        )
        try:
            op = self._api.patch_backends(
                ref.project,
                ref.name,
                backends,
                str(service.get("fingerprint", "")),
                compute_request,
            )
        except ComputeBusy:  # 412 conditionNotMet (stale fingerprint), resourceNotReady
            self._pause(min(0.2 * 2**attempt, 3.0))
            raise _Retry from None
        self._wait(ref, op)
        self._verify(cluster_id, direction, ref)

    def _verify(self, cluster_id: str, direction: str, ref: BackendServiceRef) -> None:
        """Reads the service again: the change must still be there (a controller that owns the
        service without saying so in orchestrationInfo silently undoes it)."""
        service = self._read(ref)
        if service is None:
            raise TrafficError(
                f"backend service {_service_path(ref)} disappeared right after the change"
            )
        wrong = [
            f"{b.get('group')} at {_scaler(b):g}"
            for b in self._backends_of(cluster_id, service)
            if (_scaler(b) > 0) == (direction == "out")
        ]
        if wrong:
            raise TrafficError(
                f"backend service {_service_path(ref)} was changed back right after the "
                f"{'drain' if direction == 'out' else 'restore'} ({', '.join(wrong)}): "
                "something else owns its capacityScaler (e.g. a multi-cluster Gateway "
                "controller); shift traffic with HTTPRoute weights instead, or leave this "
                "service out of traffic.backendServices"
            )

    def _wait(self, ref: BackendServiceRef, op: compute_v1.Operation) -> None:
        deadline = time.monotonic() + _COMPUTE_OP_TIMEOUT
        current = op
        interval = 0.1
        while current.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise TrafficError(
                    f"compute operation {op.name} on backend service {ref.name} did not finish "
                    f"within {_COMPUTE_OP_TIMEOUT:g} s"
                )
            self._pause(interval)
            interval = min(interval * 2, self._max_poll)
            try:
                current = self._api.get_global_operation(ref.project, op.name)
            except Unavailable as exc:
                _LOG.warning("compute operation poll failed; retrying: %s", exc.message)
        if current.error.errors:
            first = current.error.errors[0]
            raise TrafficError(
                f"compute operation {op.name} on backend service {ref.name} failed: "
                f"{first.code}: {first.message}"
            )


class _Retry(Exception):
    """The service changed under a patch: read it again."""


def _drain(backend: Backend) -> bool:
    value = _scaler(backend)
    if value == 0:
        return False
    backend["description"] = _with_marker(str(backend.get("description", "")), value)
    backend["capacityScaler"] = 0.0
    return True


def _restore(backend: Backend) -> bool:
    description = str(backend.get("description", ""))
    if _scaler(backend) > 0:
        if _marker_value(description) is None:
            return False
        # Serving already (another writer restored it): only our stale note goes.
        backend["description"] = _MARKER.sub("", description)
        return True
    previous = _marker_value(description)
    backend["capacityScaler"] = previous if previous is not None else _DEFAULT_SCALER
    backend["description"] = _MARKER.sub("", description)
    return True


def build_traffic(
    config: TrafficConfig, api: GkeApi, state: PluginState, stop: threading.Event
) -> Traffic:
    """The Traffic of the configured mode; stop set makes running work end with Stopping."""
    if config.mode == "backendServices":
        return BackendServiceTraffic(
            api,
            list(config.backend_services),
            config.backends,
            stop=stop,
            allow_zero_capacity=config.allow_zero_capacity,
        )
    return NoTraffic(state)
