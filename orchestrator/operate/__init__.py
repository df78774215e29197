"""Operator verbs of fleet-orchestrator (status, history, approve, retry, skip, stop, resume).

They talk to the apiserver like kubectl, through orchestrator.adapters.kube.KubeClient, and only
read objects or write the annotations and spec fields the controllers act on.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator import api
from orchestrator.adapters.kube import Conflict, KubeClient, KubeError, NotFound

__all__ = [
    "COMMANDS",
    "ClusterLine",
    "OperateError",
    "Request",
    "Snapshot",
    "StageLine",
    "UpgradeCache",
    "add_commands",
    "bar",
    "render",
    "render_history",
    "renderable",
    "run",
    "snapshot",
]

COMMANDS = ("status", "history", "approve", "retry", "skip", "stop", "resume")
_HOOK_PHASES = frozenset({api.UpgradePhase.PRE_HOOK.value, api.UpgradePhase.POST_HOOK.value})
_CV = "ClusterVersion"
_RUN = "UpdateRun"
_IN_FLIGHT = frozenset(
    {
        api.UpgradePhase.PRE_HOOK,
        api.UpgradePhase.POST_HOOK,
        api.UpgradePhase.SERVICING_OUT,
        api.UpgradePhase.UPGRADING_CONTROL_PLANE,
        api.UpgradePhase.UPGRADING_NODE_POOLS,
        api.UpgradePhase.VERIFYING,
        api.UpgradePhase.SERVICING_IN,
    }
)


class OperateError(Exception):
    """What is wrong with the request, and the fix."""


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    kind: str
    plural: str
    namespace: str
    name: str
    obj: dict[str, Any]


def _resolve(kube: KubeClient, namespace: str, name: str) -> _Target:
    """The ClusterVersion named NAME, else the UpdateRun named NAME."""
    for kind, plural in ((_CV, api.PLURAL), (_RUN, api.UPDATE_RUN_PLURAL)):
        try:
            obj = kube.get_object(plural, namespace, name)
        except NotFound:
            continue
        return _Target(kind, plural, namespace, name, obj)
    raise OperateError(
        f"no ClusterVersion or UpdateRun named {name!r} in namespace {namespace!r}: "
        f"list them with `kubectl get clusterversions,updateruns -n {namespace}`, "
        "or pass --namespace"
    )


def _current_run(kube: KubeClient, target: _Target) -> dict[str, Any] | None:
    """The UpdateRun a target stands for: itself, or a ClusterVersion's status.currentRun."""
    if target.kind == _RUN:
        return target.obj
    run_name = (target.obj.get("status") or {}).get("currentRun")
    if not run_name:
        return None
    try:
        return kube.get_object(api.UPDATE_RUN_PLURAL, target.namespace, run_name)
    except NotFound:
        return None


def _upgrades(kube: KubeClient, namespace: str, run_name: str) -> list[dict[str, Any]]:
    items, _ = kube.list_objects(
        api.CLUSTER_UPGRADE_PLURAL, namespace, label_selector=f"{api.LABEL_RUN}={run_name}"
    )
    return items


Upgrades = Callable[[str], list[dict[str, Any]]]


class UpgradeCache:
    """The ClusterUpgrades of one run, listed once and then kept current by a watch, so that
    `status --watch` costs the apiserver one LIST per run (and the changes), not one LIST of
    every ClusterUpgrade per interval (10,000 objects at fleet scale).

    A read for another run (a ClusterVersion's new run), or after the watch failed, lists
    again; the watch thread drops events of a watch started before the latest list.
    """

    def __init__(self, kube: KubeClient, namespace: str, watch_seconds: int = 60) -> None:
        self._kube, self._namespace, self._watch_seconds = kube, namespace, watch_seconds
        self._lock = threading.Lock()
        self._run = ""
        self._items: dict[str, dict[str, Any]] = {}
        self._version = ""
        self._generation = 0
        self._synced = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, run_name: str) -> list[dict[str, Any]]:
        """The run's ClusterUpgrades as last seen."""
        with self._lock:
            if not (self._synced and run_name == self._run):
                items, version = self._kube.list_objects(
                    api.CLUSTER_UPGRADE_PLURAL,
                    self._namespace,
                    label_selector=f"{api.LABEL_RUN}={run_name}",
                )
                self._items = {o["metadata"]["name"]: o for o in items}
                self._run, self._version, self._synced = run_name, version, True
                self._generation += 1
                self._wake.set()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._follow, name="status-watch", daemon=True
                )
                self._thread.start()
            return list(self._items.values())

    def _follow(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                generation, version = self._generation, self._version
            try:
                for event in self._kube.watch_objects(
                    api.CLUSTER_UPGRADE_PLURAL, self._namespace, version, self._watch_seconds
                ):
                    if not self._apply(generation, event.type, event.obj):
                        break
                else:
                    self._wake.set()  # the watch timed out: go on from where it stood
            except Exception:
                # Gone (410), the apiserver away, a broken stream: the next read lists again.
                with self._lock:
                    if generation == self._generation:
                        self._synced = False
                time.sleep(1.0)

    def _apply(self, generation: int, kind: str, obj: dict[str, Any]) -> bool:
        """Apply one event; False when a newer list made this watch stale."""
        with self._lock:
            if generation != self._generation:
                return False
            meta = obj.get("metadata") or {}
            self._version = str(meta.get("resourceVersion") or self._version)
            if kind == "BOOKMARK" or (meta.get("labels") or {}).get(api.LABEL_RUN) != self._run:
                return True
            if kind == "DELETED":
                self._items.pop(meta["name"], None)
            else:
                self._items[meta["name"]] = obj
            return True


@dataclass(frozen=True)
class StageLine:
    """One stage as `status` shows it."""

    name: str
    phase: str
    total: int
    upgraded: int
    failed: int
    max_failures: int | None = None


@dataclass(frozen=True)
class ClusterLine:
    """One cluster in flight, failed or blocked."""

    cluster: str
    stage: str
    phase: str
    step: str = ""
    attempt: int = 0
    reason: str = ""
    message: str = ""
    #: When its current step (else its phase) started, RFC 3339; "" when unknown.
    since: str = ""


@dataclass(frozen=True)
class Snapshot:
    """What `status` shows about a ClusterVersion or an UpdateRun, read at one moment."""

    kind: str
    namespace: str
    name: str
    phase: str
    message: str = ""
    run: str = ""
    run_phase: str = ""
    state: str = ""
    current_stage: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    stages: tuple[StageLine, ...] = ()
    in_flight: tuple[ClusterLine, ...] = ()
    failed: tuple[ClusterLine, ...] = ()
    blocked: tuple[ClusterLine, ...] = ()
    approved: tuple[str, ...] = ()
    skipped_stages: tuple[str, ...] = ()
    failures: api.FailureSummary | None = None
    next_start_time: str = ""
    waiting_reason: str = ""
    #: The moment ages and "in 2h5m" are measured from.
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def _hook_step(hook: Any) -> str:
    """A running hook as a step: "preUpgrade Running"."""
    if not isinstance(hook, dict) or not hook.get("kind"):
        return ""
    return f"{hook['kind']} {hook.get('phase') or api.HookPhase.RUNNING.value}"


def snapshot(
    kube: KubeClient, namespace: str, name: str, upgrades: Upgrades | None = None
) -> Snapshot:
    """Read a ClusterVersion (and its current run) or an UpdateRun, and its ClusterUpgrades
    (listed, or from `upgrades`, e.g. an UpgradeCache)."""
    target = _resolve(kube, namespace, name)
    read = upgrades or (lambda run: _upgrades(kube, namespace, run))
    status = target.obj.get("status") or {}
    run = _current_run(kube, target)
    run_status = (run or {}).get("status") or {}
    run_name = str((run or {}).get("metadata", {}).get("name", ""))
    lines: dict[str, list[ClusterLine]] = {"in_flight": [], "failed": [], "blocked": []}
    for cu in sorted(
        read(run_name) if run_name else [],
        key=lambda o: (o["spec"].get("stageIndex", 0), o["spec"].get("clusterId", "")),
    ):
        spec, cu_status = cu.get("spec") or {}, cu.get("status") or {}
        phase = cu_status.get("phase", api.UpgradePhase.PENDING.value)
        line = ClusterLine(
            cluster=str(spec.get("clusterId", cu["metadata"]["name"])),
            stage=str(spec.get("stage", "")),
            phase=str(phase),
            step=str(cu_status.get("step") or _hook_step(cu_status.get("hook"))),
            attempt=int(cu_status.get("attempt") or 0),
            reason=str(cu_status.get("reason") or ""),
            message=str(cu_status.get("message") or ""),
            since=str(
                cu_status.get("stepStartTime")
                or (phase in _HOOK_PHASES and (cu_status.get("hook") or {}).get("startTime"))
                or cu_status.get("lastTransitionTime")
                or cu_status.get("startTime")
                or ""
            ),
        )
        if phase in _IN_FLIGHT:
            lines["in_flight"].append(line)
        elif phase == api.UpgradePhase.FAILED:
            lines["failed"].append(line)
        elif phase == api.UpgradePhase.BLOCKED:
            lines["blocked"].append(line)
    stages = run_status.get("stages") or status.get("stages") or []
    annotations = (target.obj.get("metadata") or {}).get("annotations") or {}
    failures = run_status.get("failures")
    return Snapshot(
        kind=target.kind,
        namespace=namespace,
        name=name,
        phase=str(status.get("phase") or "Pending"),
        message=str(status.get("message") or ""),
        run=run_name,
        run_phase=str(run_status.get("phase") or ""),
        state=str(((run or {}).get("spec") or {}).get("state") or ""),
        current_stage=str(run_status.get("currentStage") or status.get("currentStage") or ""),
        counts={k: int(v) for k, v in (run_status.get("counts") or {}).items()},
        stages=tuple(
            StageLine(
                name=str(s["name"]),
                phase=str(s.get("phase", "")),
                total=int(s.get("total", 0)),
                upgraded=int(s.get("upgraded", 0)),
                failed=int(s.get("failed", 0)),
                max_failures=None if s.get("maxFailures") is None else int(s["maxFailures"]),
            )
            for s in stages
        ),
        in_flight=tuple(lines["in_flight"]),
        failed=tuple(lines["failed"]),
        blocked=tuple(lines["blocked"]),
        approved=tuple(_csv(annotations.get(api.ANNOTATION_APPROVE_STAGES))),
        skipped_stages=tuple(
            dict.fromkeys(
                [
                    *_csv(annotations.get(api.ANNOTATION_SKIP_STAGES)),
                    *(((target.obj.get("spec") or {}).get("skip") or {}).get("stages") or []),
                ]
            )
        ),
        failures=api.FailureSummary.model_validate(failures) if failures else None,
        next_start_time=str(run_status.get("nextStartTime") or ""),
        waiting_reason=str(run_status.get("waitingReason") or ""),
    )


# --- rendering -----------------------------------------------------------------------------

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


def bar(done: int, failed: int, total: int, width: int = BAR_WIDTH) -> Text:
    """A progress bar: upgraded cells █ (green), failed cells ✗ (red), the rest ░."""
    if total <= 0:
        return Text("░" * width, style="dim")
    ok = min(width, round(width * done / total))
    bad = min(width - ok, max(1 if failed else 0, round(width * failed / total)))
    out = Text()
    out.append("█" * ok, style="green")
    out.append("✗" * bad, style="bold red")
    out.append("░" * (width - ok - bad), style="dim")
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
    out: list[Text] = []
    head = Text(f"{snap.kind} {snap.namespace}/{snap.name}: ", style="bold")
    head.append_text(_phase(snap.phase))
    out.append(head)
    if snap.message:
        out.append(Text(f"  {snap.message}"))
    if snap.kind == _CV:
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
    if snap.counts:
        counts = snap.counts
        out.append(
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
        )
    if snap.failures is not None:
        budget = snap.failures
        over = budget.max_failures is not None and budget.count > budget.max_failures
        limit = (
            " (no limit)" if budget.max_failures is None else f" of {budget.max_failures} allowed"
        )
        line = Text(
            f"Failure budget: {budget.count} failed{limit}", style="bold red" if over else ""
        )
        if over:
            line.append(" (exceeded: the run halts)")
        if budget.clusters:
            line.append(f": {', '.join(budget.clusters)}")
        out.append(line)
    if snap.waiting_reason or snap.next_start_time:
        line = Text("Waiting: ", style="yellow")
        line.append(snap.waiting_reason or "for time")
        at = _time(snap.next_start_time)
        if at is not None:
            line.append(
                f"; next start {snap.next_start_time} (in {_span((at - snap.now).total_seconds())})"
            )
        out.append(line)
    if snap.stages:
        out.append(Text("Stages:"))
        rows: list[list[Text | str]] = [
            ["STAGE", "PHASE", "PROGRESS", "UPGRADED", "FAILED", "MAX-FAILURES", ""]
        ]
        for s in snap.stages:
            mark = "<- current" if s.name == snap.current_stage else ""
            rows.append(
                [
                    s.name,
                    _phase(s.phase),
                    bar(s.upgraded, s.failed, s.total),
                    f"{s.upgraded}/{s.total}",
                    Text(str(s.failed), style="red" if s.failed else ""),
                    _max(s.max_failures),
                    mark,
                ]
            )
        out.extend(_table(rows))
    more = f"kubectl get cu -n {snap.namespace} -l {api.LABEL_RUN}={snap.run or snap.name}"
    if snap.in_flight:
        out.append(Text(f"In flight ({len(snap.in_flight)}):"))
        rows = [["CLUSTER", "STAGE", "PHASE", "STEP", "AGE"]]
        rows += [
            [c.cluster, c.stage, _phase(c.phase), c.step or "-", _age(c.since, snap.now)]
            for c in snap.in_flight[:SHOWN]
        ]
        out.extend(_table(rows))
        if len(snap.in_flight) > SHOWN:
            out.append(Text(f"  ... and {len(snap.in_flight) - SHOWN} more: {more}"))
    for title, items in (("Failed", snap.failed), ("Blocked", snap.blocked)):
        if not items:
            continue
        out.append(Text(f"{title} ({len(items)}):", style="bold red" if title == "Failed" else ""))
        for c in items[:SHOWN]:
            why = ": ".join(p for p in (c.reason, c.message) if p) or "no reason recorded"
            attempt = f", attempt {c.attempt}" if c.attempt else ""
            out.append(Text(f"  {c.cluster} (stage {c.stage}{attempt}): {why}"))
        if len(items) > SHOWN:
            out.append(Text(f"  ... and {len(items) - SHOWN} more: {more}"))
        if title == "Failed":
            ids = " ".join(c.cluster for c in items[:SHOWN])
            out.append(Text(f"  retry: fleet-orchestrator retry {snap.name} {ids}", style="dim"))
            out.append(Text(f"  or skip: fleet-orchestrator skip {snap.name} {ids}", style="dim"))
    waiting = [s.name for s in snap.stages if s.phase == api.StagePhase.AWAITING_APPROVAL]
    for stage in waiting:
        out.append(
            Text(
                f"Stage {stage} awaits approval: fleet-orchestrator approve {snap.name} {stage}",
                style="yellow",
            )
        )
    if snap.approved:
        out.append(Text(f"Approved stages: {', '.join(snap.approved)}"))
    if snap.skipped_stages:
        out.append(Text(f"Skipped stages: {', '.join(snap.skipped_stages)}"))
    return Text("\n").join(out)


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


def _history(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """status.runs of the ClusterVersion, plus its UpdateRuns the history does not list."""
    target = _resolve(kube, namespace, name)
    if target.kind != _CV:
        raise OperateError(
            f"{name!r} is an UpdateRun; history lists the runs of a ClusterVersion: "
            f"use `fleet-orchestrator status {name}`"
        )
    records = list((target.obj.get("status") or {}).get("runs") or [])
    known = {r.get("name") for r in records}
    runs, _ = kube.list_objects(
        api.UPDATE_RUN_PLURAL, namespace, label_selector=f"{api.LABEL_CLUSTER_VERSION}={name}"
    )
    for run_obj in runs:
        meta, status = run_obj["metadata"], run_obj.get("status") or {}
        if meta["name"] in known:
            continue
        records.append(
            {
                "name": meta["name"],
                "phase": status.get("phase"),
                "startTime": status.get("startTime") or meta.get("creationTimestamp"),
                "endTime": status.get("endTime"),
                "message": status.get("message"),
            }
        )
    records.sort(key=lambda r: str(r.get("startTime") or ""), reverse=True)
    return records


# --- writing -------------------------------------------------------------------------------


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _annotate(
    kube: KubeClient,
    target: _Target,
    merge: Mapping[str, Iterable[str]],
    put: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """One write: add values to comma-separated annotations (keeping what is there) and set
    others; the merged values.

    The write carries the resourceVersion it was computed from, so a controller consuming an
    annotation at the same moment makes it re-read (409) instead of seeing ids come back.
    """
    obj = target.obj
    for _ in range(5):
        current = (obj.get("metadata") or {}).get("annotations") or {}
        patch: dict[str, str | None] = dict(put or {})
        merged: dict[str, str] = {}
        for key, values in merge.items():
            items = _csv(current.get(key))
            items += [v for v in values if v not in items]
            merged[key] = patch[key] = ",".join(items)
        meta = {"annotations": patch, "resourceVersion": obj["metadata"]["resourceVersion"]}
        try:
            kube.merge_patch(target.plural, target.namespace, target.name, {"metadata": meta})
        except Conflict:
            obj = kube.get_object(target.plural, target.namespace, target.name)
            continue
        return merged
    raise OperateError(
        f"{target.kind} {target.name!r} kept changing while being annotated (5 conflicts): "
        "try again"
    )


def _stage_names(kube: KubeClient, target: _Target) -> list[str]:
    strategy = ((target.obj.get("spec") or {}).get("strategy")) or {}
    names = [str(s["name"]) for s in strategy.get("stages") or []]
    if not names:
        run = _current_run(kube, target)
        names = [str(s["name"]) for s in ((run or {}).get("status") or {}).get("stages") or []]
    return names


def _check_stages(kube: KubeClient, target: _Target, stages: Iterable[str]) -> None:
    known = _stage_names(kube, target)
    unknown = [s for s in stages if s not in known]
    if unknown:
        raise OperateError(
            f"{target.kind} {target.name!r} has no stage {', '.join(map(repr, unknown))}: "
            f"its stages are {', '.join(known) or '(none: spec.strategy.stages is empty)'}"
        )


def _line(target: _Target, values: Mapping[str, str]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return f"{target.kind} {target.namespace}/{target.name}: {shown}"


def _writable(kube: KubeClient, namespace: str, name: str) -> tuple[_Target, list[str]]:
    """Where a person's annotations go: the object named, except the current run of a
    ClusterVersion, whose annotations the ClusterVersion keeps in step with its own (a value
    written on the run alone would be undone): then the ClusterVersion, with a note."""
    target = _resolve(kube, namespace, name)
    if target.kind != _RUN:
        return target, []
    owner = str(((target.obj.get("spec") or {}).get("clusterVersionRef") or {}).get("name") or "")
    if not owner:
        return target, []
    try:
        cv = kube.get_object(api.PLURAL, namespace, owner)
    except NotFound:
        return target, []
    if (cv.get("status") or {}).get("currentRun") != name:
        return target, []
    note = (
        f"note: UpdateRun {name} is the current run of ClusterVersion {owner}: written on "
        f"ClusterVersion {owner}, which hands it to the run"
    )
    return _Target(_CV, api.PLURAL, namespace, owner, cv), [note]


def approve(kube: KubeClient, namespace: str, name: str, stage: str) -> tuple[str, list[str]]:
    """Add STAGE to the approve-stages annotation; a line saying what was done, and notes."""
    target, notes = _writable(kube, namespace, name)
    _check_stages(kube, target, [stage])
    done = _annotate(kube, target, {api.ANNOTATION_APPROVE_STAGES: [stage]})
    return _line(target, done), notes


def _cluster_phases(kube: KubeClient, target: _Target) -> dict[str, str]:
    """Cluster id -> phase, from the current run's ClusterUpgrades, else from spec.clusters."""
    run = _current_run(kube, target)
    phases: dict[str, str] = {}
    if run is not None:
        for cu in _upgrades(kube, target.namespace, run["metadata"]["name"]):
            cid = str((cu.get("spec") or {}).get("clusterId", ""))
            phases[cid] = str((cu.get("status") or {}).get("phase") or "Pending")
    if not phases:
        for c in (target.obj.get("spec") or {}).get("clusters") or []:
            phases[str(c["id"])] = "Pending"
    return phases


def _check_clusters(kube: KubeClient, target: _Target, clusters: list[str]) -> dict[str, str]:
    """The phases of the target's clusters; OperateError naming any unknown one."""
    phases = _cluster_phases(kube, target)
    unknown = [c for c in clusters if c not in phases]
    if unknown:
        known = sorted(phases)
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        raise OperateError(
            f"{target.kind} {target.name!r} has no cluster {', '.join(map(repr, unknown))}: "
            f"its clusters are {shown or '(none yet: wait for the run to start)'}; "
            f"`fleet-orchestrator status {target.name}` shows them"
        )
    return phases


@dataclass(frozen=True)
class Request:
    """Who asks for a skip or a retry, and why (recorded by the controller with it)."""

    requested_by: str
    reason: str | None = None

    def annotations(self) -> dict[str, str | None]:
        """The reason and requested-by annotations (a missing reason clears an old one)."""
        return {
            api.ANNOTATION_REASON: self.reason or None,
            api.ANNOTATION_REQUESTED_BY: self.requested_by,
        }


def retry(
    kube: KubeClient, namespace: str, name: str, clusters: list[str], request: Request
) -> tuple[str, list[str]]:
    """Add clusters to retry-clusters (with who and why); a line saying what was done, notes."""
    target, notes = _writable(kube, namespace, name)
    phases = _check_clusters(kube, target, clusters)
    retryable = {api.UpgradePhase.FAILED.value, api.UpgradePhase.BLOCKED.value}
    retryable.add(api.UpgradePhase.SKIPPED.value)
    notes += [
        f"note: {c} is {phases[c]}, not Failed, Blocked or Skipped: retry does nothing to it"
        for c in clusters
        if phases[c] not in retryable
    ]
    done = _annotate(kube, target, {api.ANNOTATION_RETRY_CLUSTERS: clusters}, request.annotations())
    return _line(target, done), notes


def skip(
    kube: KubeClient,
    namespace: str,
    name: str,
    clusters: list[str],
    request: Request,
    stages: list[str] | None = None,
) -> tuple[str, list[str]]:
    """Add clusters to skip-clusters and stages to skip-stages (with who and why), in one
    write; a line saying what was done, and notes."""
    if not clusters and not stages:
        raise OperateError("name the clusters to skip, or a stage with --stage STAGE")
    target, notes = _writable(kube, namespace, name)
    merge: dict[str, list[str]] = {}
    if clusters:
        phases = _check_clusters(kube, target, clusters)
        done = {api.UpgradePhase.UPGRADED.value, api.UpgradePhase.SKIPPED.value}
        notes += [
            f"note: {c} is {phases[c]} already: skip does nothing to it"
            for c in clusters
            if phases[c] in done
        ]
        notes += [
            f"note: {c} is {phases[c]} (in flight): skip applies to Pending, Blocked and "
            "Failed clusters; this one finishes its upgrade"
            for c in clusters
            if phases[c] in _IN_FLIGHT
        ]
        merge[api.ANNOTATION_SKIP_CLUSTERS] = clusters
    if stages:
        _check_stages(kube, target, stages)
        run = _current_run(kube, target)
        finished = {api.StagePhase.COMPLETED.value, api.StagePhase.SKIPPED.value}
        for s in ((run or {}).get("status") or {}).get("stages") or []:
            if s.get("name") in stages and s.get("phase") in finished:
                notes.append(f"note: stage {s['name']} is {s['phase']}: skip changes nothing")
        merge[api.ANNOTATION_SKIP_STAGES] = stages
    return _line(target, _annotate(kube, target, merge, request.annotations())), notes


def set_state(kube: KubeClient, namespace: str, name: str, state: api.RunState) -> str:
    """Set spec.state of the UpdateRun (a ClusterVersion's current run); what was done."""
    target = _resolve(kube, namespace, name)
    run = _current_run(kube, target)
    if run is None:
        raise OperateError(
            f"ClusterVersion {name!r} has no current run (status.currentRun is empty): "
            "there is nothing to stop or resume; to hold a rollout before it starts, set "
            "spec.strategy.paused: true"
        )
    run_name = run["metadata"]["name"]
    kube.merge_patch(api.UPDATE_RUN_PLURAL, namespace, run_name, {"spec": {"state": state.value}})
    return f"UpdateRun {namespace}/{run_name}: spec.state={state.value}"


# --- the command line ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    namespace: str = "default"
    user: str = ""


def _context(kubeconfig: str | None) -> _Context:
    """The namespace and user of the kubeconfig's current context, like kubectl."""
    paths = [kubeconfig] if kubeconfig else (os.environ.get("KUBECONFIG") or "").split(os.pathsep)
    paths = [p for p in paths if p] or [str(Path.home() / ".kube" / "config")]
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        current = data.get("current-context")
        for ctx in data.get("contexts") or []:
            if ctx.get("name") == current:
                body = ctx.get("context") or {}
                return _Context(
                    str(body.get("namespace") or "default"), str(body.get("user") or "")
                )
    return _Context()


def _requested_by(args: argparse.Namespace, context: _Context) -> str:
    """--requested-by, else the kubeconfig context's user, else the local login name."""
    if getattr(args, "requested_by", None):
        return str(args.requested_by)
    if context.user:
        return context.user
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster config, then ~/.kube/config)",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace of the object (default: the kubeconfig context's, else default)",
    )


def _who(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", default=None, help="why (recorded with the request)")
    p.add_argument(
        "--requested-by",
        default=None,
        metavar="WHO",
        help="who asks (default: the kubeconfig context's user)",
    )


def add_commands(sub: Any) -> None:
    """Register the operator verbs on fleet-orchestrator's sub-command parser."""
    p = sub.add_parser(
        "status", help="show a ClusterVersion's or UpdateRun's progress (all when NAME is omitted)"
    )
    _common(p)
    p.add_argument("name", nargs="?", help="ClusterVersion or UpdateRun")
    p.add_argument("-w", "--watch", action="store_true", help="re-render on every change")
    p.add_argument(
        "--interval", type=float, default=2.0, help="--watch: seconds between reads (default 2)"
    )
    p = sub.add_parser("history", help="list the runs of a ClusterVersion, newest first")
    _common(p)
    p.add_argument("name", help="ClusterVersion")
    p = sub.add_parser("approve", help="approve a stage with approval: Manual")
    _common(p)
    p.add_argument("name", help="ClusterVersion or UpdateRun")
    p.add_argument("stage", help="the stage's name")
    p = sub.add_parser(
        "retry", help="retry Failed, Blocked or Skipped clusters (a new attempt, same targets)"
    )
    _common(p)
    p.add_argument("name", help="ClusterVersion or UpdateRun")
    p.add_argument("clusters", nargs="+", metavar="CLUSTER", help="cluster id")
    _who(p)
    p = sub.add_parser(
        "skip", help="skip clusters, or a whole stage (--stage): the run does not upgrade them"
    )
    _common(p)
    p.add_argument("name", help="ClusterVersion or UpdateRun")
    p.add_argument("clusters", nargs="*", metavar="CLUSTER", help="cluster id")
    p.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="STAGE",
        help="skip this stage: its clusters not started are Skipped (repeatable)",
    )
    _who(p)
    for verb, what in (
        ("stop", "stop a run: admit no new cluster, finish and service in those in flight"),
        ("resume", "resume a stopped run"),
    ):
        p = sub.add_parser(verb, help=what)
        _common(p)
        p.add_argument("name", help="UpdateRun, or a ClusterVersion (its current run)")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one operator verb; 0 on success, 1 with the error on stderr."""
    out = out or sys.stdout
    context = _context(args.kubeconfig)
    namespace = args.namespace or context.namespace
    try:
        kube = KubeClient(args.kubeconfig)
    except Exception as error:  # kubeconfig loading raises several kinds
        print(
            f"error: cannot load the kubeconfig ({error}); pass --kubeconfig FILE",
            file=sys.stderr,
        )
        return 1
    try:
        return _dispatch(kube, namespace, args, out, Request(_requested_by(args, context)))
    except OperateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KubeError as error:
        print(f"error: the apiserver answered {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        kube.close()


def _dispatch(
    kube: KubeClient, namespace: str, args: argparse.Namespace, out: TextIO, who: Request
) -> int:
    command = args.command
    if command == "status":
        read = _status_reader(kube, namespace, args.name, args.watch)
        if args.watch:
            _watch(read, out, args.interval)
        else:
            _print(read(), out)
    elif command == "history":
        out.write(render_history(namespace, args.name, _history(kube, namespace, args.name)))
    elif command == "approve":
        line, notes = approve(kube, namespace, args.name, args.stage)
        print(line, file=out)
        for note in notes:
            print(note, file=sys.stderr)
    elif command in ("retry", "skip"):
        request = Request(who.requested_by, args.reason)
        if command == "retry":
            line, notes = retry(kube, namespace, args.name, args.clusters, request)
        else:
            line, notes = skip(kube, namespace, args.name, args.clusters, request, args.stage)
        print(line, file=out)
        for note in notes:
            print(note, file=sys.stderr)
    else:
        state = api.RunState.STOP if command == "stop" else api.RunState.RUN
        print(set_state(kube, namespace, args.name, state), file=out)
    return 0


def _status_reader(
    kube: KubeClient, namespace: str, name: str | None, watch: bool = False
) -> Callable[[], Text]:
    if name:
        cache = UpgradeCache(kube, namespace) if watch else None
        return lambda: renderable(snapshot(kube, namespace, name, cache))

    def every() -> Text:
        cvs, _ = kube.list_objects(api.PLURAL, namespace)
        runs, _ = kube.list_objects(api.UPDATE_RUN_PLURAL, namespace)
        names = [o["metadata"]["name"] for o in cvs]
        names += [
            o["metadata"]["name"]
            for o in runs
            if api.LABEL_CLUSTER_VERSION not in (o["metadata"].get("labels") or {})
        ]
        if not names:
            return Text(f"no ClusterVersions or UpdateRuns in namespace {namespace}")
        return Text("\n\n").join(renderable(snapshot(kube, namespace, n)) for n in names)

    return every


def _print(text: Text, out: TextIO) -> None:
    """Styled on a terminal, plain text otherwise (a pipe, a log)."""
    if out.isatty():
        Console(file=out, highlight=False, soft_wrap=True).print(text)
    else:
        out.write(text.plain + "\n")


def _watch(read_once: Callable[[], Text], out: TextIO, interval: float) -> None:
    """Re-render whenever what `read` returns changes: live on a terminal, appended otherwise.

    A failed read (the apiserver away, the object deleted) is shown and read again.
    """

    def read() -> Text:
        try:
            return read_once()
        except (OperateError, KubeError) as error:
            return Text(
                f"error: {error} (reading again every {interval:g}s; Ctrl-C to leave)",
                style="bold red",
            )

    if out.isatty():
        text = read()
        console = Console(file=out, highlight=False)
        with Live(text, console=console, auto_refresh=False, transient=False) as live:
            live.refresh()
            while True:
                time.sleep(interval)
                new = read()
                if new != text:
                    text = new
                    live.update(text, refresh=True)
    last = ""
    while True:
        plain = read().plain + "\n"
        if plain != last:
            stamp = time.strftime("%H:%M:%S", time.gmtime())
            out.write(f"--- {stamp} UTC\n{plain}")
            out.flush()
            last = plain
        time.sleep(interval)
