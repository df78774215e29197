"""gate() against a brute-force model: seeded random run windows (days in a zone with DST),
provider weekly windows, scoped exclusions, expected durations and notBefore on a 5-minute grid,
around both DST changes. The model marks every 5-minute cell open, closed or excluded and
scans them one by one; gate's may_start and next_start must agree with it exactly."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from zoneinfo import ZoneInfo

import pytest

from orchestrator import api
from orchestrator.engine.observations import WindowObs
from orchestrator.engine.windows import gate

CELL = timedelta(minutes=5)
CELLS = 16 * 24 * 12  # 16 days
DAYS = list(api.Weekday)
BYDAY = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]
ZONES = ["Europe/Berlin", "America/New_York", "UTC"]
# Around Berlin's and New York's DST changes, and a quiet week.
ORIGINS = [
    datetime(2026, 3, 24, tzinfo=UTC),
    datetime(2026, 10, 21, tzinfo=UTC),
    datetime(2026, 11, 23, tzinfo=UTC),
]


class Model:
    """Cells [origin + i*CELL, origin + (i+1)*CELL) marked by naive enumeration."""

    def __init__(self, origin: datetime) -> None:
        self.origin = origin
        self.covers: list[list[bool]] = []
        self.excluded = [False] * CELLS

    def mark(self, cells: list[bool], start: datetime, end: datetime) -> None:
        a = max(0, (start - self.origin) // CELL)
        b = min(CELLS, -(-(end - self.origin) // CELL))
        for i in range(a, b):
            cells[i] = True

    def run_window(
        self, days: set[int] | None, hour: int, minute: int, length: timedelta, zone: str
    ) -> list[bool]:
        cells = [False] * CELLS
        tz = ZoneInfo(zone)
        day = (self.origin - timedelta(days=3)).date()
        while day <= (self.origin + timedelta(days=17)).date():
            if days is None or day.weekday() in days:
                opens = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
                self.mark(cells, opens, opens + length)
            day += timedelta(days=1)
        return cells

    def weekly(self, first: datetime, length: timedelta, days: set[int]) -> list[bool]:
        cells = [False] * CELLS
        day = max(first.date(), (self.origin - timedelta(days=3)).date())
        while day <= (self.origin + timedelta(days=17)).date():
            if day.weekday() in days:
                opens = datetime.combine(day, first.timetz())
                if opens >= first:
                    self.mark(cells, opens, opens + length)
            day += timedelta(days=1)
        return cells

    def next_start(self, d_cells: int, nb: int, since: int = 0) -> int | None:
        """First cell t >= since from which [t, t+D) is covered and free (D = 0: cell t)."""
        span = max(d_cells, 1)
        gaps = [
            list(accumulate((0 if c else 1 for c in cover), initial=0)) for cover in self.covers
        ]
        blocks = list(accumulate((1 if x else 0 for x in self.excluded), initial=0))
        for t in range(max(since, nb), CELLS - span):
            if all(g[t + span] == g[t] for g in gaps) and blocks[t + span] == blocks[t]:
                return t
        return None


def case(
    seed: int,
) -> tuple[api.Maintenance, tuple[WindowObs, ...], datetime, datetime | None, bool, Model]:
    rng = random.Random(seed)
    origin = rng.choice(ORIGINS)
    now = origin + CELL * rng.randrange(0, 24 * 12)
    model = Model(now)
    d_cells = rng.choice([0, 1, 6, 12, 36])
    overrun = d_cells == 0
    windows = []
    run_cover = [False] * CELLS
    for i in range(rng.choice([0, 1, 1, 2, 3])):
        zone = rng.choice(ZONES)
        days = None if rng.random() < 0.3 else set(rng.sample(range(7), rng.randint(1, 4)))
        hour, minute = rng.randrange(24), 5 * rng.randrange(12)
        length = CELL * rng.choice([6, 12, 24, 48, 96, 288])
        windows.append(
            {
                "name": f"w{i}",
                "start": f"{hour:02d}:{minute:02d}",
                "duration": f"{int(length.total_seconds()) // 60}m",
                "timeZone": zone,
                **({"days": [DAYS[d] for d in sorted(days)]} if days is not None else {}),
            }
        )
        cells = model.run_window(days, hour, minute, length, zone)
        run_cover = [a or b for a, b in zip(run_cover, cells, strict=True)]
    if windows:
        model.covers.append(run_cover)
    exclusions = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        start = now + CELL * rng.randrange(-300, 3000)
        end = start + CELL * rng.randrange(1, 600)
        exclusions.append({"start": start.isoformat(), "end": end.isoformat()})
        model.mark(model.excluded, start, end)
    policy = rng.choice(list(api.ProviderWindows))
    minor = rng.random() < 0.5
    provider: list[WindowObs] = []
    if rng.random() < 0.6:
        first = origin - timedelta(days=rng.randrange(0, 900)) + CELL * rng.randrange(288)
        length = CELL * rng.choice([12, 48, 120])
        days = set(rng.sample(range(7), rng.randint(1, 3)))
        rule = "FREQ=WEEKLY;BYDAY=" + ",".join(BYDAY[d] for d in sorted(days))
        provider.append(WindowObs("window", "", first, first + length, rule))
        if policy is not api.ProviderWindows.OFF:
            model.covers.append(model.weekly(first, length, days))
    for j in range(rng.choice([0, 1, 2])):
        start = now + CELL * rng.randrange(-300, 3000)
        end = start + CELL * rng.randrange(1, 800)
        scope = rng.choice(["NO_UPGRADES", "NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES", ""])
        provider.append(WindowObs("exclusion", f"x{j}", start, end, "", scope))
        honoured = policy is api.ProviderWindows.WINDOWS_AND_EXCLUSIONS and (
            minor or scope != "NO_MINOR_UPGRADES"
        )
        if honoured:
            model.mark(model.excluded, start, end)
    nb = now + CELL * rng.randrange(-50, 400) if rng.random() < 0.3 else None
    maintenance = api.Maintenance.model_validate(
        {
            "windows": windows or None,
            "exclusions": exclusions or None,
            "providerWindows": policy.value,
            "expectedDuration": f"{max(d_cells, 1) * 5}m",
            "allowOverrun": overrun,
        }
    )
    return maintenance, tuple(provider), now, nb, minor, model


@pytest.mark.parametrize("seed", range(300))
def test_gate_agrees_with_the_cell_model(seed: int) -> None:
    maintenance, provider, now, nb, minor, model = case(seed)
    d_cells = (
        0
        if maintenance.allow_overrun
        else int(api.parse_duration(maintenance.expected_duration) / CELL)
    )
    nb_cell = 0 if nb is None else (nb - now) // CELL
    expected = model.next_start(d_cells, nb_cell)
    got = gate(maintenance, provider, now, not_before=nb, minor=minor)
    horizon = now + CELL * (CELLS - max(d_cells, 1) - 1)
    if expected is None:
        assert got.next_start is None or got.next_start > horizon, (seed, got)
    else:
        assert got.next_start == now + CELL * expected, (seed, got, expected)
    assert got.may_start is (expected == 0), (seed, got)
    assert (got.reason == "") is got.may_start, (seed, got)
    # One microsecond before the next start, the gate is still closed (exact boundaries).
    if got.next_start is not None and got.next_start > now:
        before = gate(
            maintenance,
            provider,
            got.next_start - timedelta(microseconds=1),
            not_before=nb,
            minor=minor,
        )
        assert not before.may_start and before.next_start == got.next_start, (seed, before)
        assert gate(maintenance, provider, got.next_start, not_before=nb, minor=minor).may_start


@pytest.mark.parametrize("seed", range(0, 300, 7))
def test_later_decisions_agree_with_the_cell_model(seed: int) -> None:
    """As `now` moves on (remembered answers reused between decisions), every answer is still
    the model's."""
    maintenance, provider, now, nb, minor, model = case(seed)
    d_cells = (
        0
        if maintenance.allow_overrun
        else int(api.parse_duration(maintenance.expected_duration) / CELL)
    )
    nb_cell = 0 if nb is None else (nb - now) // CELL
    horizon = now + CELL * (CELLS - max(d_cells, 1) - 1)
    for step in range(0, 8 * 24 * 12, 97):  # every 8h05m over 8 days
        at = now + CELL * step
        expected = model.next_start(d_cells, nb_cell, since=step)
        got = gate(maintenance, provider, at, not_before=nb, minor=minor)
        if expected is None:
            assert got.next_start is None or got.next_start > horizon, (seed, step, got)
        else:
            assert got.next_start == now + CELL * expected, (seed, step, got, expected)
        assert got.may_start is (expected == step), (seed, step, got)
