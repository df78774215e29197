"""Maintenance specs at admission (orchestrator.adapters.webhook.admit, the controllers'
validate_spec): each unreadable field is refused with its path and the fix; good specs are
admitted."""

from __future__ import annotations

from typing import Any

from orchestrator import api
from orchestrator.adapters.webhook import admit
from orchestrator.engine.validate import Problem, parse_model, validate_spec
from orchestrator.engine.windows import parse_time

NS = "team-a"


def cv_spec(strategy: dict[str, Any]) -> dict[str, Any]:
    return {
        "requiredAvailableCount": 1,
        "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
        "clusters": [
            {"id": "a", "version": "1.29.4"},
            {"id": "b", "version": "1.29.4"},
            {"id": "c", "version": "1.29.4"},
        ],
        "strategy": strategy,
    }


def admitted(kind: str, spec: dict[str, Any]) -> dict[str, str]:
    request = {
        "uid": "1",
        "kind": {"group": api.GROUP, "version": api.VERSION, "kind": kind},
        "operation": "CREATE",
        "namespace": NS,
        "name": "x",
        "object": {"metadata": {"name": "x", "namespace": NS}, "spec": spec},
    }
    return {p.field: p.message for p in admit(request)}


def staged(maintenance: dict[str, Any]) -> dict[str, Any]:
    return cv_spec(
        {
            "stages": [
                {"name": "canary", "clusters": ["a"]},
                {"name": "rest", "clusters": ["b", "c"], "maintenance": maintenance},
            ]
        }
    )


GOOD = {
    "windows": [
        {
            "name": "weekend",
            "days": ["Saturday", "Sunday"],
            "start": "02:00",
            "duration": "4h",
            "timeZone": "Europe/Berlin",
        },
        {
            "rrule": "FREQ=MONTHLY;BYDAY=1SA",
            "start": "22:00",
            "duration": "6h",
            "timeZone": "America/New_York",
        },
        {
            "rrule": "DTSTART:20261107\n"
            "RRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=SA;UNTIL=20271231T000000Z",
            "start": "01:00",
            "duration": "2h",
        },
    ],
    "exclusions": [
        {"name": "holidays", "start": "2026-12-20T00:00:00Z", "end": "2027-01-04T00:00:00+01:00"}
    ],
    "providerWindows": "WindowsAndExclusions",
    "expectedDuration": "90m",
}


def test_good_maintenance_is_admitted_on_the_run_and_on_a_stage() -> None:
    assert (
        admitted(api.KIND, cv_spec({"maintenance": GOOD, "notBefore": "2026-12-01T08:00:00Z"}))
        == {}
    )
    assert admitted(api.KIND, staged(GOOD)) == {}
    assert admitted(api.UPDATE_RUN_KIND, staged(GOOD)) == {}


def test_an_unknown_time_zone_is_named_with_an_example() -> None:
    bad = {"windows": [GOOD["windows"][0], {**GOOD["windows"][0], "timeZone": "Mars/Base"}]}
    assert admitted(api.KIND, staged(bad)) == {
        "spec.strategy.stages[1].maintenance.windows[1].timeZone": (
            '"Mars/Base" is not an IANA time zone; use one such as Europe/Berlin'
        )
    }


def test_rrules_that_cannot_be_read_or_never_occur_are_refused() -> None:
    cases = {
        "FREQ=FORTNIGHTLY": "FREQ must be one of YEARLY, MONTHLY, WEEKLY, DAILY (got FORTNIGHTLY)",
        "FREQ=HOURLY": "FREQ must be one of YEARLY, MONTHLY, WEEKLY, DAILY (got HOURLY)",
        "FREQ=DAILY;BYHOUR=3": "BYHOUR is not allowed: the window's start sets the time of day",
        "FREQ=WEEKLY;BYDAY=XX": "is not a valid RRULE (invalid 'BYDAY': XX)",
        "BYDAY=MO": "FREQ must be one of YEARLY, MONTHLY, WEEKLY, DAILY (got none)",
        "FREQ=DAILY;UNTIL=20261231": "UNTIL 20261231 must be a UTC time such as 20261231T235959Z",
        "every monday": "'every monday' is not an RRULE; write it like FREQ=WEEKLY;BYDAY=SA,SU",
    }
    for rule, why in cases.items():
        window = {"rrule": rule, "start": "01:00", "duration": "2h"}
        got = admitted(api.KIND, cv_spec({"maintenance": {"windows": [window]}}))
        assert got == {
            "spec.strategy.maintenance.windows[0].rrule": (
                f"{rule!r}: {why} (RFC 5545, e.g. FREQ=MONTHLY;BYDAY=1SA)"
            )
        }, rule
    never = {"rrule": "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "start": "01:00", "duration": "2h"}
    assert admitted(api.KIND, cv_spec({"maintenance": {"windows": [never]}})) == {
        "spec.strategy.maintenance.windows[0].rrule": (
            "'FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30' never occurs; check BYMONTH / BYMONTHDAY / UNTIL"
        )
    }


def test_days_and_rrule_together_are_refused() -> None:
    both = {
        "days": ["Monday"],
        "rrule": "FREQ=MONTHLY;BYDAY=1MO",
        "start": "01:00",
        "duration": "2h",
    }
    assert admitted(api.KIND, staged({"windows": [both]})) == {
        "spec.strategy.stages[1].maintenance.windows[0]": (
            "sets both days and rrule; keep one of them"
        )
    }


def test_exclusions_need_rfc3339_times_and_an_end_after_the_start() -> None:
    bad = {
        "exclusions": [
            {"start": "2026-12-20", "end": "2026-12-21T00:00:00Z"},
            {"start": "2026-12-20T00:00:00Z", "end": "2026-12-20T00:00:00+00:00"},
            {"start": "2026-12-20T10:00:00+02:00", "end": "2026-12-20T09:00:00+01:00"},
            {"start": "2026-12-20T00:00:00Z", "end": "next week"},
        ]
    }
    assert admitted(api.KIND, cv_spec({"maintenance": bad})) == {
        "spec.strategy.maintenance.exclusions[0].start": (
            "'2026-12-20' is not an RFC 3339 time; write it like 2026-12-20T00:00:00Z"
        ),
        "spec.strategy.maintenance.exclusions[1].end": (
            "2026-12-20T00:00:00+00:00 is not after start 2026-12-20T00:00:00Z; "
            "set an end after the start"
        ),
        "spec.strategy.maintenance.exclusions[2].end": (
            "2026-12-20T09:00:00+01:00 is not after start 2026-12-20T10:00:00+02:00; "
            "set an end after the start"
        ),
        "spec.strategy.maintenance.exclusions[3].end": (
            "'next week' is not an RFC 3339 time; write it like 2026-12-20T00:00:00Z"
        ),
    }


def test_windows_that_could_never_let_a_cluster_start_are_refused() -> None:
    window = {"start": "01:00", "duration": "30m"}
    got = admitted(
        api.KIND, cv_spec({"maintenance": {"windows": [window], "expectedDuration": "1h"}})
    )
    assert got == {
        "spec.strategy.maintenance.expectedDuration": (
            "1h is longer than the only window (30m long, so no cluster could ever start); "
            "lengthen the window, shorten expectedDuration or set allowOverrun: true"
        )
    }
    overrun = {"windows": [window], "expectedDuration": "1h", "allowOverrun": True}
    assert admitted(api.KIND, cv_spec({"maintenance": overrun})) == {}
    empty = {"windows": [], "exclusions": []}
    assert admitted(api.KIND, cv_spec({"maintenance": empty})) == {
        "spec.strategy.maintenance.windows": (
            "is empty; list windows or remove it (unset: always open)"
        )
    }
    no_days = {"windows": [{**window, "days": [], "duration": "2h"}]}
    assert admitted(api.KIND, cv_spec({"maintenance": no_days})) == {
        "spec.strategy.maintenance.windows[0].days": (
            "is empty; list days or remove it (unset: every day)"
        )
    }
    zero = {"windows": [{**window, "duration": "0s"}], "allowOverrun": True}
    assert admitted(api.KIND, cv_spec({"maintenance": zero})) == {
        "spec.strategy.maintenance.windows[0].duration": (
            "0s is too short: maintenance windows are scheduled in whole minutes; set it to 1m "
            "or more"
        )
    }


def test_the_controllers_report_the_same_problems() -> None:
    raw = staged({"windows": [{**GOOD["windows"][0], "timeZone": "Mars/Base"}]})
    parsed = parse_model(api.ClusterVersionSpec, raw)
    assert not isinstance(parsed, list)
    assert validate_spec(parsed) == [
        Problem(
            "spec.strategy.stages[1].maintenance.windows[0].timeZone",
            '"Mars/Base" is not an IANA time zone; use one such as Europe/Berlin',
        )
    ]


def test_rfc3339_times_keep_their_offset_and_fraction() -> None:
    t = parse_time("2026-12-20T10:00:00.1234567+02:00")
    assert (t.utcoffset() is not None, t.microsecond) == (True, 123456)
    assert parse_time("2026-12-20t10:00:00z") == parse_time("2026-12-20T10:00:00Z")


def test_durations_over_a_year_are_refused() -> None:
    long = {"windows": [{"start": "01:00", "duration": "9000h"}], "expectedDuration": "8785h"}
    assert admitted(api.KIND, cv_spec({"maintenance": long})) == {
        "spec.strategy.maintenance.windows[0].duration": (
            "9000h is longer than 366 days; shorten it"
        ),
        "spec.strategy.maintenance.expectedDuration": "8785h is longer than 366 days; shorten it",
    }
