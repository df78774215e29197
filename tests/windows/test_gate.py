"""The maintenance gate (orchestrator.engine.windows.gate): run and stage windows by days or RRULE
in an IANA zone across DST, exclusions and the expected duration, allowOverrun, the provider's
windows and scoped exclusions, notBefore, and the exact next start within the 400-day horizon."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator import api
from orchestrator.engine.observations import WindowObs
from orchestrator.engine.windows import HORIZON, gate

US = timedelta(microseconds=1)


def spec(**fields: Any) -> api.Maintenance:
    return api.Maintenance.model_validate(fields)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


WEEKEND_BERLIN = {
    "name": "weekend",
    "days": ["Saturday", "Sunday"],
    "start": "02:00",
    "duration": "4h",
    "timeZone": "Europe/Berlin",
}
# 2026-11-23 is a Monday; Berlin is on CET (UTC+1) from 2026-10-25 to 2027-03-28.
MONDAY = utc(2026, 11, 23, 10)
SATURDAY_OPEN = utc(2026, 11, 28, 1)  # 02:00 CET
SATURDAY_CLOSE = utc(2026, 11, 28, 5)  # 06:00 CET


# -- no constraints, notBefore -------------------------------------------------------------------


def test_without_maintenance_a_cluster_may_always_start() -> None:
    assert gate(None, (), MONDAY) == gate(None, (), MONDAY, minor=False)
    g = gate(None, (), MONDAY)
    assert (g.may_start, g.next_start, g.reason) == (True, MONDAY, "")
    # An empty maintenance (no windows, no exclusions, provider windows off) is the same.
    assert gate(spec(), (), MONDAY).may_start


def test_not_before_holds_every_start_until_it_comes() -> None:
    later = MONDAY + timedelta(hours=3)
    g = gate(None, (), MONDAY, not_before=later)
    assert (g.may_start, g.next_start) == (False, later)
    assert g.reason == "notBefore 2026-11-23T13:00:00Z has not come yet"
    assert gate(None, (), later, not_before=later).may_start
    assert not gate(None, (), later - US, not_before=later).may_start
    # With windows, the later of notBefore and the next opening wins.
    m = spec(windows=[WEEKEND_BERLIN])
    g = gate(m, (), MONDAY, not_before=SATURDAY_OPEN + timedelta(hours=1))
    assert g.next_start == SATURDAY_OPEN + timedelta(hours=1)
    assert "notBefore 2026-11-28T02:00:00Z" in g.reason and "no maintenance window" in g.reason
    g = gate(m, (), MONDAY, not_before=SATURDAY_CLOSE)  # Saturday's window too late: Sunday's
    assert g.next_start == SATURDAY_OPEN + timedelta(days=1)


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        gate(None, (), datetime(2026, 11, 23))


# -- the run's windows ---------------------------------------------------------------------------


def test_a_weekly_window_opens_on_its_days_in_its_zone() -> None:
    m = spec(windows=[WEEKEND_BERLIN])
    g = gate(m, (), MONDAY)
    assert (g.may_start, g.next_start) == (False, SATURDAY_OPEN)
    assert g.reason == "no maintenance window is open ('weekend')"
    assert gate(m, (), SATURDAY_OPEN).may_start
    assert not gate(m, (), SATURDAY_OPEN - US).may_start
    assert gate(m, (), SATURDAY_OPEN - US).next_start == SATURDAY_OPEN


def test_a_start_needs_the_expected_duration_left_in_the_window() -> None:
    m = spec(windows=[WEEKEND_BERLIN], expectedDuration="1h")
    last = SATURDAY_CLOSE - timedelta(hours=1)
    assert gate(m, (), last).may_start  # ends exactly as the window closes
    g = gate(m, (), last + US)
    assert not g.may_start
    assert g.next_start == SATURDAY_OPEN + timedelta(days=1)  # Sunday 02:00 CET
    assert g.reason == (
        "maintenance window 'weekend' closes at 2026-11-28T05:00:00Z, before an upgrade "
        "expected to take 1h would finish (allowOverrun: false)"
    )
    # A window shorter than the expected duration never lets a start through.
    short = spec(windows=[{**WEEKEND_BERLIN, "duration": "30m"}], expectedDuration="1h")
    g = gate(short, (), MONDAY)
    assert (g.may_start, g.next_start) == (False, None)
    assert g.reason.endswith(f"nothing opens within {HORIZON.days} days")


def test_allow_overrun_starts_whenever_the_window_is_open() -> None:
    m = spec(windows=[WEEKEND_BERLIN], expectedDuration="3h", allowOverrun=True)
    assert gate(m, (), SATURDAY_CLOSE - US).may_start
    g = gate(m, (), SATURDAY_CLOSE)
    assert (g.may_start, g.next_start) == (False, SATURDAY_OPEN + timedelta(days=1))


def test_every_day_when_neither_days_nor_rrule_is_set() -> None:
    m = spec(windows=[{"start": "22:30", "duration": "2h"}])  # UTC by default
    g = gate(m, (), MONDAY)
    assert g.next_start == utc(2026, 11, 23, 22, 30)
    assert gate(m, (), utc(2026, 11, 23, 23, 30)).may_start  # across midnight, ends 00:30
    assert not gate(m, (), utc(2026, 11, 23, 23, 31)).may_start


def test_touching_windows_form_one_open_span() -> None:
    # Saturday 22:00-24:00 and Sunday 00:00-02:00: a 3h upgrade started at 22:30 fits.
    m = spec(
        windows=[
            {"name": "late", "days": ["Saturday"], "start": "22:00", "duration": "2h"},
            {"name": "early", "days": ["Sunday"], "start": "00:00", "duration": "2h"},
        ],
        expectedDuration="3h",
    )
    assert gate(m, (), utc(2026, 11, 28, 22, 30)).may_start
    assert not gate(m, (), utc(2026, 11, 28, 23, 1)).may_start
    assert gate(m, (), MONDAY).next_start == utc(2026, 11, 28, 22)


def test_a_monthly_rrule_opens_on_the_first_saturday() -> None:
    m = spec(
        windows=[
            {
                "name": "monthly",
                "rrule": "FREQ=MONTHLY;BYDAY=1SA",
                "start": "03:00",
                "duration": "4h",
                "timeZone": "America/New_York",
            }
        ]
    )
    # First Saturday of December 2026: the 5th; New York is on EST (UTC-5).
    assert gate(m, (), MONDAY).next_start == utc(2026, 12, 5, 8)
    assert gate(m, (), utc(2026, 12, 5, 10)).may_start
    # After it: January 2nd 2027.
    assert gate(m, (), utc(2026, 12, 5, 11, 1)).next_start == utc(2027, 1, 2, 8)


def test_an_rrule_with_dtstart_and_interval_keeps_its_phase() -> None:
    m = spec(
        windows=[
            {
                "rrule": "DTSTART:20261107\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=SA",
                "start": "01:00",
                "duration": "2h",
            }
        ]
    )
    # Every other Saturday from 2026-11-07: the 21st, then December 5th (not the 28th).
    assert gate(m, (), MONDAY).next_start == utc(2026, 12, 5, 1)
    assert gate(m, (), utc(2026, 11, 20)).next_start == utc(2026, 11, 21, 1)
    # Far from the anchor (the expansion starts a whole number of periods later): same phase,
    # 83 fortnights after 2026-11-07.
    assert gate(m, (), utc(2030, 1, 1)).next_start == utc(2030, 1, 12, 1)


def test_an_ended_rrule_opens_nothing() -> None:
    m = spec(
        windows=[{"rrule": "FREQ=DAILY;UNTIL=20261001T000000Z", "start": "01:00", "duration": "2h"}]
    )
    g = gate(m, (), MONDAY)
    assert (g.may_start, g.next_start) == (False, None)


# -- DST ----------------------------------------------------------------------------------------


DAILY_0230_BERLIN = {"start": "02:30", "duration": "1h", "timeZone": "Europe/Berlin"}


def test_spring_forward_in_berlin_opens_with_the_offset_before_the_gap() -> None:
    # 2026-03-29 02:30 does not exist in Berlin (02:00 CET -> 03:00 CEST): RFC 5545 reads it
    # with the offset before the gap, 02:30 CET = 01:30 UTC (03:30 CEST).
    m = spec(windows=[DAILY_0230_BERLIN], expectedDuration="30m")
    assert gate(m, (), utc(2026, 3, 28, 12)).next_start == utc(2026, 3, 29, 1, 30)
    assert gate(m, (), utc(2026, 3, 29, 2)).may_start
    assert not gate(m, (), utc(2026, 3, 29, 2, 0, 1)).may_start  # 02:30 UTC close - 30m
    # The day before (CET) and the day after (CEST) open at 02:30 local.
    assert gate(m, (), utc(2026, 3, 27, 12)).next_start == utc(2026, 3, 28, 1, 30)
    assert gate(m, (), utc(2026, 3, 29, 12)).next_start == utc(2026, 3, 30, 0, 30)


def test_fall_back_in_berlin_opens_at_the_first_of_the_two_times() -> None:
    # 2026-10-25 02:30 happens twice in Berlin (CEST, then CET): the first, 00:30 UTC.
    m = spec(windows=[{**DAILY_0230_BERLIN, "duration": "2h"}], expectedDuration="2h")
    assert gate(m, (), utc(2026, 10, 24, 12)).next_start == utc(2026, 10, 25, 0, 30)
    # The duration is elapsed time: open until 02:30 UTC (03:30 CET, local 02:30 + 2h - 1h).
    assert gate(m, (), utc(2026, 10, 25, 0, 30)).may_start
    assert not gate(m, (), utc(2026, 10, 25, 0, 31)).may_start
    assert gate(m, (), utc(2026, 10, 25, 12)).next_start == utc(2026, 10, 26, 1, 30)


def test_new_york_spring_forward_and_fall_back() -> None:
    m = spec(
        windows=[{"start": "02:30", "duration": "4h", "timeZone": "America/New_York"}],
        expectedDuration="1h",
    )
    # 2026-03-08 02:30 is in New York's gap: 02:30 EST = 07:30 UTC (03:30 EDT).
    assert gate(m, (), utc(2026, 3, 8, 0)).next_start == utc(2026, 3, 8, 7, 30)
    assert gate(m, (), utc(2026, 3, 9, 0)).next_start == utc(2026, 3, 9, 6, 30)  # EDT
    m = spec(
        windows=[{"start": "01:30", "duration": "4h", "timeZone": "America/New_York"}],
        expectedDuration="4h",
    )
    # 2026-11-01 01:30 happens twice (EDT, then EST): the first, 05:30 UTC, 4h elapsed.
    assert gate(m, (), utc(2026, 11, 1, 0)).next_start == utc(2026, 11, 1, 5, 30)
    assert gate(m, (), utc(2026, 11, 1, 5, 30)).may_start
    assert not gate(m, (), utc(2026, 11, 1, 5, 30) + US).may_start
    assert gate(m, (), utc(2026, 11, 1, 6)).next_start == utc(2026, 11, 2, 6, 30)  # EST


# -- exclusions ---------------------------------------------------------------------------------


FREEZE = {"name": "freeze", "start": "2026-11-28T00:00:00Z", "end": "2026-11-29T03:00:00Z"}


def test_inside_an_exclusion_nothing_starts_until_it_ends() -> None:
    m = spec(windows=[WEEKEND_BERLIN], exclusions=[FREEZE], expectedDuration="1h")
    g = gate(m, (), SATURDAY_OPEN)
    assert not g.may_start
    assert g.reason == "inside maintenance exclusion 'freeze' until 2026-11-29T03:00:00Z"
    # Sunday's window (01:00-05:00 UTC) is open when the freeze ends at 03:00.
    assert g.next_start == utc(2026, 11, 29, 3)
    assert gate(m, (), utc(2026, 11, 29, 3)).may_start


def test_an_exclusion_beginning_within_the_expected_duration_refuses_a_start() -> None:
    freeze = {"name": "freeze", "start": "2026-11-28T03:00:00Z", "end": "2026-11-28T04:00:00Z"}
    m = spec(windows=[WEEKEND_BERLIN], exclusions=[freeze], expectedDuration="1h")
    assert gate(m, (), SATURDAY_OPEN + timedelta(hours=1)).may_start  # ends as it begins
    g = gate(m, (), SATURDAY_OPEN + timedelta(hours=1) + US)
    assert not g.may_start
    assert g.reason == (
        "maintenance exclusion 'freeze' starts at 2026-11-28T03:00:00Z, before an upgrade "
        "expected to take 1h would finish"
    )
    assert g.next_start == utc(2026, 11, 28, 4)  # the freeze ends with 1h of window left
    # allowOverrun: only being inside the exclusion refuses a start.
    overrun = spec(windows=[WEEKEND_BERLIN], exclusions=[freeze], allowOverrun=True)
    assert gate(overrun, (), utc(2026, 11, 28, 3) - US).may_start
    assert gate(overrun, (), utc(2026, 11, 28, 3)).next_start == utc(2026, 11, 28, 4)


def test_overlapping_exclusions_block_together() -> None:
    m = spec(
        exclusions=[
            {"name": "a", "start": "2026-11-23T09:00:00Z", "end": "2026-11-23T12:00:00Z"},
            {"start": "2026-11-23T10:30:00Z", "end": "2026-11-23T15:00:00+01:00"},
        ]
    )
    g = gate(m, (), MONDAY)
    assert g.next_start == utc(2026, 11, 23, 14)
    assert g.reason == (
        "inside maintenance exclusion 'a' until 2026-11-23T12:00:00Z; "
        "maintenance exclusion exclusions[1] starts at 2026-11-23T10:30:00Z, before an upgrade "
        "expected to take 1h would finish"
    )


def test_an_exclusion_longer_than_the_horizon_leaves_no_next_start() -> None:
    m = spec(exclusions=[{"start": "2026-01-01T00:00:00Z", "end": "2028-06-01T00:00:00Z"}])
    g = gate(m, (), MONDAY)
    assert (g.may_start, g.next_start) == (False, None)
    assert g.reason == (
        "inside maintenance exclusion exclusions[0] until 2028-06-01T00:00:00Z; "
        "nothing opens within 400 days"
    )
    # Just inside the horizon it is found.
    near = spec(exclusions=[{"start": "2026-01-01T00:00:00Z", "end": "2027-12-28T10:00:00Z"}])
    assert gate(near, (), MONDAY).next_start == MONDAY + HORIZON


# -- the provider's windows and exclusions -------------------------------------------------------


def window(start: datetime, hours: int, recurrence: str = "") -> WindowObs:
    return WindowObs("window", "", start, start + timedelta(hours=hours), recurrence)


def exclusion(name: str, start: datetime, end: datetime, scope: str = "") -> WindowObs:
    return WindowObs("exclusion", name, start, end, "", scope)


# GKE's example: weekends 04:00-10:00 UTC, first occurrence long ago.
GKE_WEEKENDS = window(utc(2019, 1, 5, 4), 6, "FREQ=WEEKLY;BYDAY=SA,SU")
NIGHTLY_UTC = {"start": "00:00", "duration": "6h"}


def test_provider_windows_are_ignored_when_off() -> None:
    m = spec(windows=[NIGHTLY_UTC])
    assert gate(m, (GKE_WEEKENDS,), utc(2026, 11, 24, 1)).may_start  # a Tuesday night


def test_provider_windows_intersect_the_runs_windows() -> None:
    m = spec(windows=[NIGHTLY_UTC], providerWindows="Windows", expectedDuration="1h")
    g = gate(m, (GKE_WEEKENDS,), utc(2026, 11, 24, 1))
    assert not g.may_start
    assert g.reason == "outside the provider's maintenance windows"
    assert g.next_start == utc(2026, 11, 28, 4)  # Saturday 04:00, both open until 06:00
    assert gate(m, (GKE_WEEKENDS,), utc(2026, 11, 28, 5)).may_start
    assert not gate(m, (GKE_WEEKENDS,), utc(2026, 11, 28, 5) + US).may_start
    # Without the run's own windows, the provider's alone decide.
    alone = spec(providerWindows="Windows")
    assert gate(alone, (GKE_WEEKENDS,), utc(2026, 11, 28, 9)).may_start
    assert gate(alone, (GKE_WEEKENDS,), MONDAY).next_start == utc(2026, 11, 28, 4)
    # A cluster that reports no window is not held by the policy.
    assert gate(alone, (), MONDAY).may_start


def test_a_gke_daily_window_recurs_from_its_reported_occurrence() -> None:
    daily = window(utc(2026, 11, 23, 3, 30), 4, "FREQ=DAILY")
    m = spec(providerWindows="Windows", expectedDuration="1h")
    assert gate(m, (daily,), MONDAY).next_start == utc(2026, 11, 24, 3, 30)
    assert gate(m, (daily,), utc(2026, 12, 25, 6, 30)).may_start
    assert gate(m, (daily,), utc(2026, 12, 25, 6, 31)).next_start == utc(2026, 12, 26, 3, 30)


NO_MINOR = exclusion(
    "no-minor", utc(2026, 11, 1), utc(2027, 3, 1), "NO_MINOR_UPGRADES"
)  # a long one, as users keep to stop GKE's own minor upgrades


@pytest.mark.parametrize(
    ("scope", "minor", "blocked"),
    [
        ("NO_UPGRADES", False, True),
        ("NO_MINOR_OR_NODE_UPGRADES", False, True),  # we always upgrade node pools
        ("NO_MINOR_UPGRADES", True, True),
        ("NO_MINOR_UPGRADES", False, False),
        ("", False, True),
        ("SOMETHING_NEW", False, True),
    ],
)
def test_provider_exclusions_apply_by_scope(scope: str, minor: bool, blocked: bool) -> None:
    freeze = exclusion("freeze", utc(2026, 11, 23), utc(2026, 11, 24), scope)
    both = spec(providerWindows="WindowsAndExclusions")
    g = gate(both, (freeze,), MONDAY, minor=minor)
    assert g.may_start is not blocked
    if blocked:
        assert g.next_start == utc(2026, 11, 24)
        shown = f" (scope {scope})" if scope else ""
        assert g.reason == (
            f"inside the provider's maintenance exclusion 'freeze'{shown} until "
            "2026-11-24T00:00:00Z"
        )
    # Windows only: the provider's exclusions are not honoured.
    assert gate(spec(providerWindows="Windows"), (freeze,), MONDAY, minor=minor).may_start


def test_provider_exclusions_combine_with_the_runs_windows_and_exclusions() -> None:
    m = spec(
        windows=[NIGHTLY_UTC],
        exclusions=[
            {"name": "ours", "start": "2026-11-24T00:00:00Z", "end": "2026-11-24T02:00:00Z"}
        ],
        providerWindows="WindowsAndExclusions",
        expectedDuration="1h",
    )
    theirs = exclusion("theirs", utc(2026, 11, 24, 1), utc(2026, 11, 25, 4), "NO_UPGRADES")
    g = gate(m, (theirs, NO_MINOR), utc(2026, 11, 24, 0, 30), minor=False)
    assert g.reason == (
        "inside maintenance exclusion 'ours' until 2026-11-24T02:00:00Z; "
        "the provider's maintenance exclusion 'theirs' (scope NO_UPGRADES) starts at "
        "2026-11-24T01:00:00Z, before an upgrade expected to take 1h would finish"
    )
    assert g.next_start == utc(2026, 11, 25, 4)  # ours, then theirs, then the night's last 2h
    assert not gate(m, (theirs, NO_MINOR), utc(2026, 11, 25, 4), minor=True).may_start


def test_an_unreadable_provider_recurrence_holds_the_cluster_and_says_how_to_ignore_it() -> None:
    odd = window(utc(2026, 1, 1), 4, "FREQ=FORTNIGHTLY")
    g = gate(spec(providerWindows="Windows"), (odd,), MONDAY)
    assert (g.may_start, g.next_start) == (False, None)
    assert g.reason == (
        "the provider reports a maintenance window that cannot be read (FREQ must be one of "
        "YEARLY, MONTHLY, WEEKLY, DAILY, HOURLY, MINUTELY, SECONDLY (got FORTNIGHTLY)); "
        "set maintenance.providerWindows: Off to ignore the provider's windows"
    )
    assert gate(spec(), (odd,), MONDAY).may_start


def test_a_spec_that_cannot_be_read_holds_every_cluster_and_names_the_field() -> None:
    m = spec(windows=[{**WEEKEND_BERLIN, "timeZone": "Mars/Base"}])
    g = gate(m, (), SATURDAY_OPEN)
    assert (g.may_start, g.next_start) == (False, None)
    assert g.reason == (
        'the maintenance spec cannot be honoured: maintenance.windows[0].timeZone: "Mars/Base" '
        "is not an IANA time zone; use one such as Europe/Berlin"
    )


# -- caching ------------------------------------------------------------------------------------


def test_equal_specs_give_equal_answers_and_answers_follow_now() -> None:
    a = spec(windows=[WEEKEND_BERLIN])
    b = spec(windows=[dict(WEEKEND_BERLIN)])
    assert a is not b
    assert gate(a, (), MONDAY) == gate(b, (), MONDAY)
    assert gate(a, (), SATURDAY_OPEN).may_start and not gate(b, (), MONDAY).may_start
    other = spec(windows=[{**WEEKEND_BERLIN, "start": "03:00"}])
    assert gate(other, (), MONDAY).next_start == SATURDAY_OPEN + timedelta(hours=1)
