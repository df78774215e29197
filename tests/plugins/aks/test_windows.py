"""AKS maintenance configurations as MaintenanceWindows: each schedule kind's RRULE and first
occurrence, notAllowedDates as whole-day exclusions, and the older `default` form."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from dateutil import rrule

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.aks.windows import maintenance_windows

NOW = datetime(2030, 3, 13, 12, 0, tzinfo=UTC)  # a Wednesday
WINDOW = cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW
EXCLUSION = cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION


def _config(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "properties": properties}


def _utc(stamp: Any) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "rule", "first"),
    [
        ({"daily": {"intervalDays": 3}}, "FREQ=DAILY;INTERVAL=3", datetime(2030, 3, 1, 1)),
        (
            {"absoluteMonthly": {"intervalMonths": 1, "dayOfMonth": 15}},
            "FREQ=MONTHLY;INTERVAL=1;BYMONTHDAY=15",
            datetime(2030, 3, 15, 1),
        ),
        (
            {"relativeMonthly": {"intervalMonths": 2, "weekIndex": "Last", "dayOfWeek": "Friday"}},
            "FREQ=MONTHLY;INTERVAL=2;BYDAY=FR;BYSETPOS=-1",
            datetime(2030, 3, 29, 1),
        ),
        (
            {"relativeMonthly": {"intervalMonths": 1, "weekIndex": "First", "dayOfWeek": "Monday"}},
            "FREQ=MONTHLY;INTERVAL=1;BYDAY=MO;BYSETPOS=1",
            datetime(2030, 3, 4, 1),
        ),
    ],
)
def test_each_schedule_becomes_an_rrule_from_its_start_date(
    schedule: dict[str, Any], rule: str, first: datetime
) -> None:
    config = _config(
        "aksManagedNodeOSUpgradeSchedule",
        {
            "maintenanceWindow": {
                "schedule": schedule,
                "durationHours": 5,
                "startDate": "2030-03-01",
                "startTime": "01:00",
            }
        },
    )
    (window,) = maintenance_windows([config], NOW)
    assert (window.kind, window.name, window.recurrence) == (
        WINDOW,
        "aksManagedNodeOSUpgradeSchedule",
        rule,
    )
    assert _utc(window.start_time) == first.replace(tzinfo=UTC)
    assert (_utc(window.end_time) - _utc(window.start_time)).total_seconds() == 5 * 3600
    # The RRULE the caller reads gives the same first occurrence.
    again = rrule.rrulestr(rule, dtstart=datetime(2030, 3, 1, 1, tzinfo=UTC))[0]
    assert again == first.replace(tzinfo=UTC)


def test_without_a_start_date_the_next_occurrence_from_today() -> None:
    config = _config(
        "aksManagedAutoUpgradeSchedule",
        {
            "maintenanceWindow": {
                "schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Sunday"}},
                "durationHours": 4,
                "startTime": "03:00",
                "utcOffset": "-05:00",
            }
        },
    )
    (window,) = maintenance_windows([config], NOW)
    # Sunday 2030-03-17 03:00 at -05:00 is 08:00 UTC.
    assert _utc(window.start_time) == datetime(2030, 3, 17, 8, tzinfo=UTC)


def test_the_older_default_form_gives_weekly_windows_and_exclusions() -> None:
    config = _config(
        "default",
        {
            "timeInWeek": [
                {"day": "Monday", "hourSlots": [1, 2, 3, 22]},
                {"day": "Wednesday", "hourSlots": [14]},
            ],
            "notAllowedTime": [{"start": "2030-12-24T00:00:00Z", "end": "2030-12-27T00:00:00Z"}],
        },
    )
    windows = maintenance_windows([config], NOW)
    assert [(w.kind, w.recurrence) for w in windows] == [
        (WINDOW, "FREQ=WEEKLY;BYDAY=MO"),
        (WINDOW, "FREQ=WEEKLY;BYDAY=MO"),
        (WINDOW, "FREQ=WEEKLY;BYDAY=WE"),
        (EXCLUSION, ""),
    ]
    monday_early, monday_late, wednesday, exclusion = windows
    assert _utc(monday_early.start_time) == datetime(2030, 3, 18, 1, tzinfo=UTC)
    assert _utc(monday_early.end_time) == datetime(2030, 3, 18, 4, tzinfo=UTC)
    assert _utc(monday_late.start_time) == datetime(2030, 3, 18, 22, tzinfo=UTC)
    assert _utc(wednesday.start_time) == datetime(2030, 3, 13, 14, tzinfo=UTC)
    assert exclusion.scope == "PLANNED_MAINTENANCE"
    assert exclusion.name == "default/notAllowedTime[0]"
    assert _utc(exclusion.end_time) == datetime(2030, 12, 27, tzinfo=UTC)


def test_configurations_come_by_name_and_empty_ones_report_nothing() -> None:
    windows = maintenance_windows(
        [
            _config("default", {}),
            _config(
                "aksManagedAutoUpgradeSchedule",
                {"maintenanceWindow": {"schedule": {"daily": {"intervalDays": 1}}}},
            ),
        ],
        NOW,
    )
    assert [w.name for w in windows] == ["aksManagedAutoUpgradeSchedule"]
    assert (_utc(windows[0].end_time) - _utc(windows[0].start_time)).total_seconds() == 4 * 3600
