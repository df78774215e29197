"""AKS planned maintenance (maintenanceConfigurations) as the contract's MaintenanceWindow list.

AKS's rules (https://learn.microsoft.com/azure/aks/planned-maintenance): the configuration
`aksManagedAutoUpgradeSchedule` says when AKS's *automatic* cluster upgrades may run,
`aksManagedNodeOSUpgradeSchedule` when automatic node OS upgrades may, and `default` (the
older form: timeInWeek hour slots and notAllowedTime) when AKS's own weekly releases may.
None of them applies to an upgrade a user asks for, so the plugin reports them as information
and does not refuse manual upgrades because of them.

Each maintenanceWindow is a WINDOW with an RFC 5545 RRULE (daily / weekly / absoluteMonthly /
relativeMonthly, its interval, durationHours, utcOffset, startDate, startTime); each
notAllowedDates span (whole days, end date included) and each notAllowedTime span is an
EXCLUSION whose scope names what it holds back.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

from dateutil import rrule
from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2

__all__ = ["SCOPES", "maintenance_windows"]

Json = dict[str, Any]
SCOPES = {
    "aksManagedAutoUpgradeSchedule": "AUTO_UPGRADE",
    "aksManagedNodeOSUpgradeSchedule": "NODE_OS_UPGRADE",
    "default": "PLANNED_MAINTENANCE",
}
"""What each AKS maintenance configuration governs, as an exclusion's scope."""

_DAYS = {
    "Monday": "MO",
    "Tuesday": "TU",
    "Wednesday": "WE",
    "Thursday": "TH",
    "Friday": "FR",
    "Saturday": "SA",
    "Sunday": "SU",
}
_WEEKDAY = {name: index for index, name in enumerate(_DAYS)}
_WEEK_INDEX = {"First": 1, "Second": 2, "Third": 3, "Fourth": 4, "Last": -1}
_OFFSET = re.compile(r"^([+-])(\d{2}):(\d{2})$")


def _stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC).replace(tzinfo=None))
    return stamp


def _zone(offset: str) -> timezone:
    match = _OFFSET.match(offset or "")
    if match is None:
        return UTC
    sign, hours, minutes = match.groups()
    delta = timedelta(hours=int(hours), minutes=int(minutes))
    return timezone(-delta if sign == "-" else delta)


def _rule(schedule: Json) -> str | None:
    if "daily" in schedule:
        return f"FREQ=DAILY;INTERVAL={int(schedule['daily'].get('intervalDays') or 1)}"
    if "weekly" in schedule:
        weekly = schedule["weekly"]
        return (
            f"FREQ=WEEKLY;INTERVAL={int(weekly.get('intervalWeeks') or 1)};"
            f"BYDAY={_DAYS[weekly['dayOfWeek']]}"
        )
    if "absoluteMonthly" in schedule:
        monthly = schedule["absoluteMonthly"]
        return (
            f"FREQ=MONTHLY;INTERVAL={int(monthly.get('intervalMonths') or 1)};"
            f"BYMONTHDAY={int(monthly['dayOfMonth'])}"
        )
    if "relativeMonthly" in schedule:
        monthly = schedule["relativeMonthly"]
        return (
            f"FREQ=MONTHLY;INTERVAL={int(monthly.get('intervalMonths') or 1)};"
            f"BYDAY={_DAYS[monthly['dayOfWeek']]};BYSETPOS={_WEEK_INDEX[monthly['weekIndex']]}"
        )
    return None


def _window(name: str, window: Json, now: datetime) -> list[cluster_pb2.MaintenanceWindow]:
    zone = _zone(str(window.get("utcOffset") or ""))
    found: list[cluster_pb2.MaintenanceWindow] = []
    rule = _rule(window.get("schedule") or {})
    if rule is not None:
        hour, _, minute = str(window.get("startTime") or "00:00").partition(":")
        clock = time(int(hour or 0), int(minute or 0), tzinfo=zone)
        if window.get("startDate"):
            anchor = datetime.combine(date.fromisoformat(str(window["startDate"])), clock)
        else:  # no startDate: the next occurrence from today (AKS anchors at creation)
            anchor = datetime.combine(now.astimezone(zone).date(), clock)
        first = rrule.rrulestr(rule, dtstart=anchor).after(anchor, inc=True)
        if first is not None:
            length = timedelta(hours=int(window.get("durationHours") or 4))
            found.append(
                cluster_pb2.MaintenanceWindow(
                    kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
                    name=name,
                    start_time=_stamp(first),
                    end_time=_stamp(first + length),
                    recurrence=rule,
                )
            )
    for index, span in enumerate(window.get("notAllowedDates") or []):
        start = datetime.combine(date.fromisoformat(str(span["start"])), time(0, tzinfo=zone))
        end = datetime.combine(date.fromisoformat(str(span["end"])), time(0, tzinfo=zone))
        found.append(
            cluster_pb2.MaintenanceWindow(
                kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION,
                name=f"{name}/notAllowedDates[{index}]",
                start_time=_stamp(start),
                end_time=_stamp(end + timedelta(days=1)),  # the end date is included
                scope=SCOPES.get(name, name),
            )
        )
    return found


def _parse_time(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _legacy(name: str, props: Json, now: datetime) -> list[cluster_pb2.MaintenanceWindow]:
    """The `default` configuration's older form: hour slots (UTC) per weekday and
    notAllowedTime spans."""
    found: list[cluster_pb2.MaintenanceWindow] = []
    today = now.astimezone(UTC).date()
    for slot in props.get("timeInWeek") or []:
        day = str(slot.get("day") or "")
        hours = sorted({int(h) for h in slot.get("hourSlots") or []})
        if day not in _DAYS or not hours:
            continue
        runs: list[list[int]] = []
        for hour in hours:
            if runs and runs[-1][-1] == hour - 1:
                runs[-1].append(hour)
            else:
                runs.append([hour])
        ahead = (_WEEKDAY[day] - today.weekday()) % 7
        first_day = today + timedelta(days=ahead)
        for run in runs:
            start = datetime.combine(first_day, time(run[0], tzinfo=UTC))
            found.append(
                cluster_pb2.MaintenanceWindow(
                    kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
                    name=name,
                    start_time=_stamp(start),
                    end_time=_stamp(start + timedelta(hours=len(run))),
                    recurrence=f"FREQ=WEEKLY;BYDAY={_DAYS[day]}",
                )
            )
    for index, span in enumerate(props.get("notAllowedTime") or []):
        found.append(
            cluster_pb2.MaintenanceWindow(
                kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION,
                name=f"{name}/notAllowedTime[{index}]",
                start_time=_stamp(_parse_time(span["start"])),
                end_time=_stamp(_parse_time(span["end"])),
                scope=SCOPES.get(name, name),
            )
        )
    return found


def maintenance_windows(
    configurations: list[Json], now: datetime | None = None
) -> list[cluster_pb2.MaintenanceWindow]:
    """Every configuration's windows then exclusions, configurations by name."""
    moment = now or datetime.now(UTC)
    found: list[cluster_pb2.MaintenanceWindow] = []
    for config in sorted(configurations, key=lambda c: str(c.get("name"))):
        name = str(config.get("name") or "")
        props = config.get("properties") or {}
        if props.get("maintenanceWindow"):
            found.extend(_window(name, props["maintenanceWindow"], moment))
        found.extend(_legacy(name, props, moment))
    return found
