"""What the plugin writes onto approval requests: its workload condition, and Events.

The condition (HEALTH_CONDITION) says what the plugin sees of the stage's workloads; it is
written only when that changed, conditional on the resourceVersion read, with an Event beside
it. A failed write backs off per approval request (backoff.py); a conflict waits for the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from plugins.kubefleet.backoff import WriteBackoff
from plugins.kubefleet.gates import GateView
from plugins.kubefleet.objects import (
    EVENTS_NAMESPACE,
    MANAGED_BY,
    condition,
    format_time,
    generation,
    set_condition,
)
from plugins.sdk import Kube, KubeConflict, KubeError, KubeNotFound, Resource

__all__ = ["HEALTH_CONDITION", "ApprovalNotes"]

_LOG = logging.getLogger("plugins.kubefleet.notes")

HEALTH_CONDITION = "fleetupgrade.io/WorkloadsHealthy"
"""The condition this plugin writes on approval requests: what it sees of the stage's workloads."""

_COMPONENT = MANAGED_BY


class ApprovalNotes:
    """The condition and Events this plugin writes on approval requests."""

    def __init__(self, kube: Kube, writes: WriteBackoff) -> None:
        self._kube = kube
        self._writes = writes

    def note(self, view: GateView, now: datetime) -> None:
        """Writes our condition on the approval request when what we see changed (+ Event)."""
        obj = view.obj
        current = condition((obj.get("status") or {}).get("conditions"), HEALTH_CONDITION)
        if current is not None and (
            current.get("status"),
            current.get("reason"),
            current.get("message"),
        ) == (view.status, view.reason, view.message):
            return
        key = f"note/{view.ref.id}"
        if not self._writes.may_write(key):
            return
        res = view.ref.request
        conds = set_condition(
            (obj.get("status") or {}).get("conditions"),
            HEALTH_CONDITION,
            view.status,
            view.reason,
            view.message,
            generation(obj),
            now,
        )
        body = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": {"conditions": conds},
        }
        try:
            written = self._kube.patch_status(res, view.ref.namespace, view.ref.name, body)
        except (KubeConflict, KubeNotFound):
            return  # the cache will bring the newer object (or its deletion) next pass
        except KubeError as exc:
            self._writes.failed(key, "write the workload condition", exc)
            return
        self._writes.succeeded(key)
        warning = view.status != "True"
        self.event(res, written, view.reason, view.message, warning=warning)

    def event(
        self, res: Resource, obj: Mapping[str, Any], reason: str, message: str, *, warning: bool
    ) -> None:
        """Records an Event on obj (best effort: a failure is logged at info)."""
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "") or EVENTS_NAMESPACE
        stamp = format_time(datetime.now(UTC))
        involved = {
            "apiVersion": res.api_version,
            "kind": res.kind,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        }
        if res.namespaced:
            involved["namespace"] = namespace
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason[:128],
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": _COMPONENT},
            "reportingComponent": _COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._kube.create_event(namespace, body)
        except KubeError as exc:
            _LOG.info("event not recorded", extra={"fields": {"error": exc.message}})
