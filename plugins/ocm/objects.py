"""Shared vocabulary of the OCM plugin: our labels, annotations, conditions, verdicts, versions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk import version_meets

__all__ = [
    "ANNOTATION_OPERATION_ID",
    "ANNOTATION_REQUEST_ID",
    "ANNOTATION_STARTED_AT",
    "ANNOTATION_TARGET_VERSION",
    "LABEL_MANAGED_BY",
    "MANAGED_BY",
    "MANAGED_SELECTOR",
    "Verdict",
    "annotations_of",
    "condition",
    "format_time",
    "parse_time",
    "timed_out",
    "version_reached",
]

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
"""Label on every object this plugin creates (ClusterCurators it drives, ManifestWorks)."""

MANAGED_BY = "fleet-plugin-ocm"
"""The value of LABEL_MANAGED_BY."""

MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
"""Label selector of the objects this plugin watches besides ManagedClusters."""

ANNOTATION_REQUEST_ID = "fleetupgrade.io/request-id"
"""The request_id that started the upgrade an object carries: a restarted plugin finds it."""

ANNOTATION_OPERATION_ID = "fleetupgrade.io/operation-id"
"""The Operation id of that request (derived from the request_id)."""

ANNOTATION_TARGET_VERSION = "fleetupgrade.io/target-version"
"""The version the upgrade goes to."""

ANNOTATION_STARTED_AT = "fleetupgrade.io/started-at"
"""When the upgrade started (RFC 3339, UTC): monitorTimeout counts from here, across restarts."""

_State = int  # cluster_pb2.OperationState values


@dataclass(frozen=True)
class Verdict:
    """Where one upgrade stands, as read from hub objects."""

    state: _State
    progress: int = 0
    error_code: str = ""
    message: str = ""

    @property
    def terminal(self) -> bool:
        """SUCCEEDED or FAILED."""
        return self.state in (
            cluster_pb2.OPERATION_STATE_SUCCEEDED,
            cluster_pb2.OPERATION_STATE_FAILED,
        )


def condition(conditions: Any, kind: str) -> Mapping[str, Any] | None:
    """The condition of this type in a metav1.Condition list, or None."""
    if not isinstance(conditions, list):
        return None
    for item in conditions:
        if isinstance(item, Mapping) and item.get("type") == kind:
            return item
    return None


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """The object's annotations (empty when none)."""
    return (obj.get("metadata") or {}).get("annotations") or {}


def version_reached(current: str, target: str) -> bool:
    """True when a cluster at current has reached target (version_meets: a bare 1.29.1 is met
    by 1.29.1+k3s1); False when either does not parse."""
    try:
        return version_meets(current, target)
    except ValueError:
        return False


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with seconds, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    """Parses an RFC 3339 time; None when absent or malformed."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def timed_out(started: datetime, now: datetime, timeout: timedelta, last: str) -> Verdict | None:
    """A FAILED verdict (TIMEOUT, naming the last state seen) once timeout has passed."""
    if now - started <= timeout:
        return None
    seconds = timeout.total_seconds()
    limit = f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
    return Verdict(
        cluster_pb2.OPERATION_STATE_FAILED,
        0,
        "TIMEOUT",
        f"no result within monitorTimeout ({limit}); last state: {last or 'none'}",
    )
