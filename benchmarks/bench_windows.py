"""Micro-benchmark of the maintenance gate (orchestrator.engine.windows.gate): µs per call when the
engine asks it for every cluster of a 10,000-cluster decision. Prints numbers; not a test.

Each scenario runs DECISIONS decisions one minute apart (the engine's `now` moves, so whole
answers are recomputed once per distinct input and decision; schedules are reused within the
UTC day), and reports the first decision (cold: schedules expanded) and the mean of the rest.

    python -m benchmarks.bench_windows [--clusters 10000] [--decisions 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from orchestrator import api
from orchestrator.engine.observations import WindowObs
from orchestrator.engine.windows import gate

__all__ = ["main"]

MONDAY = datetime(2026, 11, 23, 10, tzinfo=UTC)  # every window below is closed: next_start searched
RUN = api.Maintenance.model_validate(
    {
        "windows": [
            {
                "name": "weekend",
                "days": ["Saturday", "Sunday"],
                "start": "02:00",
                "duration": "6h",
                "timeZone": "Europe/Berlin",
            },
            {
                "name": "monthly",
                "rrule": "FREQ=MONTHLY;BYDAY=1WE",
                "start": "22:00",
                "duration": "4h",
                "timeZone": "America/New_York",
            },
        ],
        "exclusions": [
            {"name": "holidays", "start": "2026-12-20T00:00:00Z", "end": "2027-01-04T00:00:00Z"}
        ],
        "providerWindows": "WindowsAndExclusions",
        "expectedDuration": "1h",
    }
)


def provider(i: int) -> tuple[WindowObs, ...]:
    """A GKE cluster's report: its daily window (start varies with i) and a long exclusion."""
    start = MONDAY.replace(hour=0) + timedelta(minutes=5 * (i % 288))
    return (
        WindowObs("window", "", start, start + timedelta(hours=4), "FREQ=DAILY"),
        WindowObs(
            "exclusion",
            "no-minor",
            datetime(2026, 11, 1, tzinfo=UTC),
            datetime(2027, 5, 1, tzinfo=UTC),
            "",
            "NO_MINOR_UPGRADES",
        ),
    )


def run(
    name: str,
    maintenance: api.Maintenance | None,
    reports: Sequence[tuple[WindowObs, ...]],
    decisions: int,
    origin: datetime,
) -> None:
    per_decision = []
    for k in range(decisions):
        now = origin + timedelta(minutes=k)
        started = time.perf_counter()
        for i, report in enumerate(reports):
            gate(maintenance, report, now, minor=i % 2 == 0)
        per_decision.append((time.perf_counter() - started) / len(reports) * 1e6)
    warm = sum(per_decision[1:]) / max(1, len(per_decision) - 1)
    print(f"{name:<44} cold {per_decision[0]:8.1f} µs/call   warm {warm:8.2f} µs/call")


def main(argv: list[str] | None = None) -> int:
    """Runs every scenario and prints µs per call."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_windows")
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=5)
    args = parser.parse_args(argv)
    n, d = args.clusters, args.decisions
    print(f"maintenance gate, {n} clusters per decision, {d} decisions one minute apart")
    run("no maintenance", None, [()] * n, d, MONDAY)
    same = [provider(0)] * n
    run("identical inputs (one spec, one report)", RUN, same, d, MONDAY)
    run(
        "100 distinct provider reports",
        RUN,
        [provider(i % 100) for i in range(n)],
        d,
        MONDAY + timedelta(days=1),
    )
    run(
        f"{min(n, 288)} distinct reports, windows only",
        RUN.model_copy(update={"provider_windows": api.ProviderWindows.WINDOWS}),
        [provider(i) for i in range(n)],
        d,
        MONDAY + timedelta(days=2),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
