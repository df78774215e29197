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
from typing import Protocol

from google.cloud import compute_v1

from plugins.gke.api import ComputeBusy, GkeApi
from plugins.gke.config import BackendServiceRef, TrafficConfig
from plugins.gke.ids import group_key
from plugins.gke.state import PluginState
from plugins.sdk.errors import FailedPrecondition, PluginError, Unavailable

__all__ = [
    "DRAIN_MARKER",
    "BackendServiceTraffic",
    "NoTraffic",
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


class Traffic(Protocol):
    """How a cluster is taken out of and put back into service."""

    def in_service(self, cluster_ids: list[str]) -> dict[str, bool]:
        """Each cluster's service state now."""
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

    def in_service(self, cluster_ids: list[str]) -> dict[str, bool]:
        out = self._state.out_of_service()
        return {c: c not in out for c in cluster_ids}

    def needs_out(self, cluster_id: str) -> bool:
        return cluster_id not in self._state.out_of_service()

    def needs_in(self, cluster_id: str) -> bool:
        return cluster_id in self._state.out_of_service()

    def service_out(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        self._state.set_out_of_service(cluster_id, True)

    def service_in(self, cluster_id: str, request_id: str, progress: Progress) -> None:
        self._state.set_out_of_service(cluster_id, False)


def _scaler(backend: compute_v1.Backend) -> float:
    return float(backend.capacity_scaler) if "capacity_scaler" in backend else _DEFAULT_SCALER


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


class BackendServiceTraffic:
    """Mode backendServices: capacityScaler 0 on the cluster's backends drains it."""

    immediate = False

    def __init__(
        self,
        api: GkeApi,
        services: list[BackendServiceRef],
        backends: Mapping[str, list[str]],
        max_poll_seconds: float = 2.0,
        stop: threading.Event | None = None,
    ) -> None:
        self._api = api
        self._stop = stop if stop is not None else threading.Event()
        self._services = services
        self._groups = {cid: {group_key(g) for g in groups} for cid, groups in backends.items()}
        self._max_poll = max_poll_seconds
        self._locks = {(s.project, s.name): threading.Lock() for s in services}

    def _backends_of(
        self, cluster_id: str, service: compute_v1.BackendService
    ) -> list[compute_v1.Backend]:
        groups = self._groups.get(cluster_id, set())
        return [b for b in service.backends if group_key(b.group) in groups]

    def _scalers(self, cluster_id: str) -> list[float]:
        if cluster_id not in self._groups:
            raise FailedPrecondition(
                f"traffic.backends: cluster {cluster_id} has no backend groups configured; add "
                "its instance group or NEG URLs to drain it"
            )
        found: list[float] = []
        for ref in self._services:
            service = self._api.get_backend_service(ref.project, ref.name)
            found.extend(_scaler(b) for b in self._backends_of(cluster_id, service))
        if not found:
            names = ", ".join(
                f"projects/{s.project}/global/backendServices/{s.name}" for s in self._services
            )
            raise FailedPrecondition(
                f"traffic.backends: none of cluster {cluster_id}'s groups is a backend of "
                f"{names}; check the group URLs"
            )
        return found

    def in_service(self, cluster_ids: list[str]) -> dict[str, bool]:
        services = [self._api.get_backend_service(s.project, s.name) for s in self._services]
        result: dict[str, bool] = {}
        for cluster_id in cluster_ids:
            scalers = [_scaler(b) for s in services for b in self._backends_of(cluster_id, s)]
            # Partly drained counts as out: the availability floor must not count it.
            result[cluster_id] = all(value > 0 for value in scalers)
        return result

    def needs_out(self, cluster_id: str) -> bool:
        return any(value > 0 for value in self._scalers(cluster_id))

    def needs_in(self, cluster_id: str) -> bool:
        return any(value == 0 for value in self._scalers(cluster_id))

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

    def _patch_one(
        self, cluster_id: str, request_id: str, direction: str, ref: BackendServiceRef
    ) -> None:
        for attempt in range(_PATCH_ATTEMPTS):
            if self._stop.is_set():
                raise Stopping
            service = self._api.get_backend_service(ref.project, ref.name)
            groups = self._groups.get(cluster_id, set())
            changed = False
            backends: list[compute_v1.Backend] = []
            for backend in service.backends:
                if group_key(backend.group) in groups:
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
                    ref.project, ref.name, backends, service.fingerprint, compute_request
                )
            except ComputeBusy:
                self._pause(min(0.2 * 2**attempt, 3.0))
                continue
            self._wait(ref, op)
            return
        raise Unavailable(
            f"backend service projects/{ref.project}/global/backendServices/{ref.name} kept "
            "changing under the plugin; retry"
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


def _drain(backend: compute_v1.Backend) -> bool:
    value = _scaler(backend)
    if value == 0:
        return False
    backend.description = _with_marker(backend.description, value)
    backend.capacity_scaler = 0.0
    return True


def _restore(backend: compute_v1.Backend) -> bool:
    if _scaler(backend) > 0:
        return False
    previous = _marker_value(backend.description)
    backend.capacity_scaler = previous if previous is not None else _DEFAULT_SCALER
    backend.description = _MARKER.sub("", backend.description)
    return True


def build_traffic(
    config: TrafficConfig, api: GkeApi, state: PluginState, stop: threading.Event
) -> Traffic:
    """The Traffic of the configured mode; stop set makes running work end with Stopping."""
    if config.mode == "backendServices":
        return BackendServiceTraffic(api, list(config.backend_services), config.backends, stop=stop)
    return NoTraffic(state)
