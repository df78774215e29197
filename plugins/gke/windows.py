"""A GKE cluster's maintenance policy as the contract's MaintenanceWindow list: the recurring
window (WINDOW) and each exclusion (EXCLUSION with its scope), reported as information.

GKE's rules (https://cloud.google.com/kubernetes-engine/docs/concepts/maintenance-windows-and-
exclusions): a maintenance window is when GKE's *automatic* maintenance may run; an exclusion
is when it must not. Neither applies to upgrades a user asks for, so the plugin reports them and
does not refuse manual upgrades because of them unless upgrades.respectMaintenanceExclusions is
set (see policy.exclusion_refusal).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from google.cloud import container_v1
from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2

__all__ = ["as_datetime", "exclusion_scope", "maintenance_windows"]

_Scope = container_v1.MaintenanceExclusionOptions.Scope
_DURATION = re.compile(r"^P?T?(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?$")
_DEFAULT_DAILY = timedelta(hours=4)  # GKE's daily windows last four hours
#: An exclusion GKE answers without an end (endTimeBehavior UNTIL_END_OF_SUPPORT ends with the
#: support of the cluster's version) or without a start: reported as until further notice / since
#: always, the contract's times being REQUIRED.
_FOREVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
_ALWAYS = datetime(1970, 1, 1, tzinfo=UTC)


def as_datetime(value: object) -> datetime:
    """proto-plus answers Timestamp fields as datetimes; accept a raw Timestamp as well."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, timestamp_pb2.Timestamp):
        return value.ToDatetime(tzinfo=UTC)
    raise TypeError(f"not a time: {type(value).__name__}")


def exclusion_scope(window: container_v1.TimeWindow) -> int:
    """The exclusion's scope; NO_UPGRADES when none is set (the documented default)."""
    if "maintenance_exclusion_options" in window:
        return int(window.maintenance_exclusion_options.scope)
    return int(_Scope.NO_UPGRADES)


def _scope_name(value: int) -> str:
    try:
        return str(_Scope(value).name)
    except ValueError:
        return str(value)


def _stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC).replace(tzinfo=None))
    return stamp


def _duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip()) if text else None
    if not match or not any(match.groups()):
        return _DEFAULT_DAILY
    hours, minutes, seconds = match.groups()
    return timedelta(hours=int(hours or 0), minutes=int(minutes or 0), seconds=float(seconds or 0))


def _daily(
    window: container_v1.DailyMaintenanceWindow, now: datetime
) -> cluster_pb2.MaintenanceWindow:
    """The daily window's current occurrence (or the next one), recurring every day."""
    hour, _, minute = window.start_time.partition(":")
    length = _duration(window.duration)
    start = datetime.combine(now.date(), datetime.min.time(), UTC).replace(
        hour=int(hour or 0), minute=int(minute or 0)
    )
    if start - timedelta(days=1) + length > now:
        start -= timedelta(days=1)  # still inside yesterday's occurrence
    elif start + length <= now:
        start += timedelta(days=1)
    return cluster_pb2.MaintenanceWindow(
        kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
        start_time=_stamp(start),
        end_time=_stamp(start + length),
        recurrence="FREQ=DAILY",
    )


def _recurring(window: container_v1.RecurringTimeWindow) -> cluster_pb2.MaintenanceWindow:
    return cluster_pb2.MaintenanceWindow(
        kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
        start_time=_stamp(as_datetime(window.window.start_time)),
        end_time=_stamp(as_datetime(window.window.end_time)),
        recurrence=window.recurrence,
    )


def _recurring_maintenance(
    window: container_v1.RecurringMaintenanceWindow,
) -> cluster_pb2.MaintenanceWindow:
    day = window.delay_until
    first = date(day.year, day.month, day.day) if day.year else date(1970, 1, 1)
    clock = window.window_start_time
    start = datetime(first.year, first.month, first.day, clock.hours, clock.minutes, tzinfo=UTC)
    duration: object = window.window_duration  # proto-plus answers a Duration as a timedelta
    length = (
        duration
        if isinstance(duration, timedelta)
        else timedelta(seconds=getattr(duration, "seconds", 0))
    )
    return cluster_pb2.MaintenanceWindow(
        kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
        start_time=_stamp(start),
        end_time=_stamp(start + length),
        recurrence=window.recurrence,
    )


def maintenance_windows(
    cluster: container_v1.Cluster, now: datetime | None = None
) -> list[cluster_pb2.MaintenanceWindow]:
    """The cluster's window (if any) then its exclusions by name, as GKE reports them."""
    policy = cluster.maintenance_policy.window
    found: list[cluster_pb2.MaintenanceWindow] = []
    if "daily_maintenance_window" in policy:
        found.append(_daily(policy.daily_maintenance_window, now or datetime.now(UTC)))
    elif "recurring_window" in policy:
        found.append(_recurring(policy.recurring_window))
    elif "recurring_maintenance_window" in policy:
        found.append(_recurring_maintenance(policy.recurring_maintenance_window))
    for name in sorted(policy.maintenance_exclusions):
        window = policy.maintenance_exclusions[name]
        entry = cluster_pb2.MaintenanceWindow(
            kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION,
            name=name,
            scope=_scope_name(exclusion_scope(window)),
        )
        start = as_datetime(window.start_time) if "start_time" in window else _ALWAYS
        end = as_datetime(window.end_time) if "end_time" in window else _FOREVER
        entry.start_time.CopyFrom(_stamp(start))
        entry.end_time.CopyFrom(_stamp(end))
        found.append(entry)
    return found
