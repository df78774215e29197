"""What `status` and `history` print: the read model as styled text (rich) and plain tables."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.text import Text

from orchestrator import api
from orchestrator.operate.read import CV, Snapshot

__all__ = ["BAR_WIDTH", "SHOWN", "bar", "render", "render_history", "renderable"]


#: Styles of phases in the live view (plain text carries the same words).
_PHASE_STYLE = {
    "Completed": "green",
    "Succeeded": "green",
    "Upgraded": "green",
    "Progressing": "cyan",
    "Verifying": "cyan",
    "Soaking": "cyan",
    "AwaitingApproval": "yellow",
    "Paused": "yellow",
    "Stopping": "yellow",
    "Stopped": "yellow",
    "Skipped": "dim",
    "Halted": "bold red",
    "Failed": "bold red",
    "Invalid": "bold red",
}


BAR_WIDTH = 20


#: Clusters listed per section (in flight, failed, blocked); the rest is counted.
SHOWN = 20


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _span(seconds: float) -> str:
    """A short duration: 45s, 4m, 2h5m, 3d4h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _age(since: str, now: datetime) -> str:
    at = _time(since)
    return _span((now - at).total_seconds()) if at else "-"


def bar(done: int, failed: int, total: int, width: int = BAR_WIDTH, skipped: int = 0) -> Text:
    """A progress bar: upgraded cells █ (green), skipped cells ─ (dim), failed cells ✗ (red),
    the rest ░."""
    if total <= 0:
        return Text("░" * width, style="dim")
    ok = min(width, round(width * done / total))
    passed = min(width - ok, max(1 if skipped else 0, round(width * skipped / total)))
    bad = min(width - ok - passed, max(1 if failed else 0, round(width * failed / total)))
    out = Text()
    out.append("█" * ok, style="green")
    out.append("─" * passed, style="dim")
    out.append("✗" * bad, style="bold red")
    out.append("░" * (width - ok - passed - bad), style="dim")
    return out


def _table(rows: Sequence[Sequence[Text | str]], indent: str = "  ") -> list[Text]:
    cells = [[c if isinstance(c, Text) else Text(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    out = []
    for n, r in enumerate(cells):
        line = Text(indent)
        for i, (cell, w) in enumerate(zip(r, widths, strict=True)):
            if i:
                line.append("  ")
            line.append_text(cell if n else Text(cell.plain, style="bold"))
            line.append(" " * (w - len(cell)))
        line.rstrip()
        out.append(line)
    return out


def _phase(text: str) -> Text:
    return Text(text, style=_PHASE_STYLE.get(text, ""))


def _max(value: int | None) -> str:
    return "-" if value is None else str(value)


def renderable(snap: Snapshot) -> Text:
    """The snapshot as styled text: what `status` prints and `--watch` keeps live."""
    sections = (
        _heading,
        _counts,
        _providers,
        _budget,
        _waiting,
        _stages,
        _in_flight,
        _failed,
        _next_steps,
    )
    return Text("\n").join(line for section in sections for line in section(snap))


def _heading(snap: Snapshot) -> list[Text]:
    """The object and its phase, its message, its current run, and a pending stop."""
    out: list[Text] = []
    head = Text(f"{snap.kind} {snap.namespace}/{snap.name}: ", style="bold")
    head.append_text(_phase(snap.phase))
    out.append(head)
    if snap.cause:
        # What stops the run comes first: "Pending / run starting" alone would hide it.
        out.append(Text(f"  Cannot progress: {snap.cause}", style="bold red"))
        if snap.fix:
            out.append(Text(f"  Fix: {snap.fix}", style="yellow"))
    if snap.degraded:
        # A provider of several down: the rest goes on where the floor allows.
        out.append(Text(f"  Degraded: {snap.degraded}", style="yellow"))
    if snap.message and not (snap.cause and snap.cause in snap.message):
        out.append(Text(f"  {snap.message}"))
    if snap.kind == CV:
        if snap.run:
            line = Text(f"Current run: {snap.run} (")
            line.append_text(_phase(snap.run_phase or "Pending"))
            line.append(")")
            out.append(line)
        else:
            out.append(Text("Current run: none yet"))
    if snap.state == api.RunState.STOP:
        out.append(
            Text(
                f"Stopping: spec.state is Stop (resume: fleet-orchestrator resume {snap.name})",
                style="yellow",
            )
        )
    return out


def _counts(snap: Snapshot) -> list[Text]:
    """The run's clusters by outcome."""
    if not snap.counts:
        return []
    counts = snap.counts
    return [
        Text(
            "Clusters: "
            + ", ".join(
                f"{counts.get(k, 0)} {label}"
                for k, label in (
                    ("total", "total"),
                    ("upgraded", "upgraded"),
                    ("inFlight", "in flight"),
                    ("pending", "pending"),
                    ("failed", "failed"),
                    ("blocked", "blocked"),
                    ("skipped", "skipped"),
                )
            )
        )
    ]


def _providers(snap: Snapshot) -> list[Text]:
    """The run's FleetProviders and their clusters (a run over several: spec.providerRefs)."""
    if not snap.providers:
        return []
    return [
        Text(
            "Providers: "
            + ", ".join(
                f"{name} {done}/{total} upgraded"
                for name, (total, done) in sorted(snap.providers.items())
            )
        )
    ]


def _budget(snap: Snapshot) -> list[Text]:
    """Failures against the run's budget."""
    if snap.failures is None:
        return []
    budget = snap.failures
    over = budget.max_failures is not None and budget.count > budget.max_failures
    limit = " (no limit)" if budget.max_failures is None else f" of {budget.max_failures} allowed"
    line = Text(f"Failure budget: {budget.count} failed{limit}", style="bold red" if over else "")
    if over:
        line.append(" (exceeded: the run halts)")
    if budget.clusters:
        line.append(f": {', '.join(budget.clusters)}")
    return [line]


def _waiting(snap: Snapshot) -> list[Text]:
    """What the run waits for, and when it may start a cluster next."""
    if not (snap.waiting_reason or snap.next_start_time):
        return []
    line = Text("Waiting: ", style="yellow")
    line.append(snap.waiting_reason or "for time")
    at = _time(snap.next_start_time)
    if at is not None:
        line.append(
            f"; next start {snap.next_start_time} (in {_span((at - snap.now).total_seconds())})"
        )
    return [line]


def _stages(snap: Snapshot) -> list[Text]:
    """The stage table."""
    if not snap.stages:
        return []
    rows: list[list[Text | str]] = [
        ["STAGE", "PHASE", "PROGRESS", "UPGRADED", "SKIPPED", "FAILED", "MAX-FAILURES", ""]
    ]
    for s in snap.stages:
        mark = "<- current" if s.name == snap.current_stage else ""
        rows.append(
            [
                s.name,
                _phase(s.phase),
                bar(s.upgraded, s.failed, s.total, skipped=s.skipped),
                f"{s.upgraded}/{s.total}",
                str(s.skipped),
                Text(str(s.failed), style="red" if s.failed else ""),
                _max(s.max_failures),
                mark,
            ]
        )
    return [Text("Stages:"), *_table(rows)]


def _more(snap: Snapshot) -> str:
    """The kubectl command that lists every ClusterUpgrade of the run."""
    return f"kubectl get cu -n {snap.namespace} -l {api.LABEL_RUN}={snap.run or snap.name}"


def _in_flight(snap: Snapshot) -> list[Text]:
    """The clusters in flight (the first SHOWN), with their step and its age."""
    if not snap.in_flight:
        return []
    out = [Text(f"In flight ({len(snap.in_flight)}):")]
    shown = snap.in_flight[:SHOWN]
    # The PROVIDER column where clusters name their FleetProvider (spec.providerName).
    named = any(c.provider for c in shown)
    rows: list[list[Text | str]] = [
        ["CLUSTER", *(["PROVIDER"] if named else []), "STAGE", "PHASE", "STEP", "AGE"]
    ]
    rows += [
        [
            c.cluster,
            *([c.provider or "-"] if named else []),
            c.stage,
            _phase(c.phase),
            c.step or "-",
            _age(c.since, snap.now),
        ]
        for c in shown
    ]
    out.extend(_table(rows))
    if len(snap.in_flight) > SHOWN:
        out.append(Text(f"  ... and {len(snap.in_flight) - SHOWN} more: {_more(snap)}"))
    return out


def _failed(snap: Snapshot) -> list[Text]:
    """The failed and the blocked clusters (the first SHOWN of each) and why; retry or skip."""
    out: list[Text] = []
    for title, items in (("Failed", snap.failed), ("Blocked", snap.blocked)):
        if not items:
            continue
        out.append(Text(f"{title} ({len(items)}):", style="bold red" if title == "Failed" else ""))
        for c in items[:SHOWN]:
            why = ": ".join(p for p in (c.reason, c.message) if p) or "no reason recorded"
            attempt = f", attempt {c.attempt + 1}"  # 1-based, as Events and messages say
            via = f"provider {c.provider}, " if c.provider else ""
            out.append(Text(f"  {c.cluster} ({via}stage {c.stage}{attempt}): {why}"))
        if len(items) > SHOWN:
            out.append(Text(f"  ... and {len(items) - SHOWN} more: {_more(snap)}"))
        if title == "Failed":
            ids = " ".join(c.cluster for c in items[:SHOWN])
            out.append(Text(f"  retry: fleet-orchestrator retry {snap.name} {ids}", style="dim"))
            out.append(Text(f"  or skip: fleet-orchestrator skip {snap.name} {ids}", style="dim"))
    return out


def _next_steps(snap: Snapshot) -> list[Text]:
    """Stages awaiting approval (with the command), approved and skipped stages."""
    out = [
        Text(
            f"Stage {s.name} awaits approval: fleet-orchestrator approve {snap.name} {s.name}",
            style="yellow",
        )
        for s in snap.stages
        if s.phase == api.StagePhase.AWAITING_APPROVAL
    ]
    if snap.approved:
        out.append(Text(f"Approved stages: {', '.join(snap.approved)}"))
    if snap.skipped_stages:
        out.append(Text(f"Skipped stages: {', '.join(snap.skipped_stages)}"))
    return out


def render(snap: Snapshot) -> str:
    """The snapshot as the plain text `status` prints."""
    return renderable(snap).plain + "\n"


def render_history(namespace: str, name: str, records: list[dict[str, Any]]) -> str:
    """A ClusterVersion's runs, newest first."""
    if not records:
        return f"ClusterVersion {namespace}/{name} has no runs yet\n"
    rows = [["RUN", "PHASE", "STARTED", "ENDED", "MESSAGE"]]
    for r in records:
        rows.append(
            [
                str(r.get("name", "")),
                str(r.get("phase") or "-"),
                str(r.get("startTime") or "-"),
                str(r.get("endTime") or "-"),
                str(r.get("message") or ""),
            ]
        )
    return "\n".join(line.plain for line in _table(rows, indent="")) + "\n"
