"""Operator verbs of fleet-orchestrator (status, history, approve, retry, skip, stop, resume).

They talk to the apiserver like kubectl, through orchestrator.kube.KubeClient, and only read
objects or write the annotations and spec fields the controllers act on.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from orchestrator import api
from orchestrator.kube import KubeClient, KubeError, NotFound

__all__ = [
    "COMMANDS",
    "ClusterLine",
    "OperateError",
    "Snapshot",
    "StageLine",
    "add_commands",
    "render",
    "render_history",
    "run",
    "snapshot",
]

COMMANDS = ("status", "history", "approve", "retry", "skip", "stop", "resume")
_CV = "ClusterVersion"
_RUN = "UpdateRun"
_IN_FLIGHT = frozenset(
    {
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


@dataclass(frozen=True)
class StageLine:
    """One stage as `status` shows it."""

    name: str
    phase: str
    total: int
    upgraded: int
    failed: int


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


def snapshot(kube: KubeClient, namespace: str, name: str) -> Snapshot:
    """Read a ClusterVersion (and its current run) or an UpdateRun, and its ClusterUpgrades."""
    target = _resolve(kube, namespace, name)
    status = target.obj.get("status") or {}
    run = _current_run(kube, target)
    run_status = (run or {}).get("status") or {}
    run_name = str((run or {}).get("metadata", {}).get("name", ""))
    lines: dict[str, list[ClusterLine]] = {"in_flight": [], "failed": [], "blocked": []}
    for cu in sorted(
        _upgrades(kube, namespace, run_name) if run_name else [],
        key=lambda o: (o["spec"].get("stageIndex", 0), o["spec"].get("clusterId", "")),
    ):
        spec, cu_status = cu.get("spec") or {}, cu.get("status") or {}
        phase = cu_status.get("phase", api.UpgradePhase.PENDING.value)
        line = ClusterLine(
            cluster=str(spec.get("clusterId", cu["metadata"]["name"])),
            stage=str(spec.get("stage", "")),
            phase=str(phase),
            step=str(cu_status.get("step") or ""),
            attempt=int(cu_status.get("attempt") or 0),
            reason=str(cu_status.get("reason") or ""),
            message=str(cu_status.get("message") or ""),
        )
        if phase in _IN_FLIGHT:
            lines["in_flight"].append(line)
        elif phase == api.UpgradePhase.FAILED:
            lines["failed"].append(line)
        elif phase == api.UpgradePhase.BLOCKED:
            lines["blocked"].append(line)
    stages = run_status.get("stages") or status.get("stages") or []
    annotations = (target.obj.get("metadata") or {}).get("annotations") or {}
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
            )
            for s in stages
        ),
        in_flight=tuple(lines["in_flight"]),
        failed=tuple(lines["failed"]),
        blocked=tuple(lines["blocked"]),
        approved=tuple(_csv(annotations.get(api.ANNOTATION_APPROVE_STAGES))),
    )


# --- rendering -----------------------------------------------------------------------------


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def render(snap: Snapshot) -> str:
    """The snapshot as the text `status` prints."""
    out = [f"{snap.kind} {snap.namespace}/{snap.name}: {snap.phase}"]
    if snap.message:
        out.append(f"  {snap.message}")
    if snap.kind == _CV:
        if snap.run:
            out.append(f"Current run: {snap.run} ({snap.run_phase or 'Pending'})")
        else:
            out.append("Current run: none yet")
    if snap.state == api.RunState.STOP:
        out.append(f"Stopping: spec.state is Stop (resume: fleet-orchestrator resume {snap.name})")
    if snap.counts:
        counts = snap.counts
        out.append(
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
    if snap.stages:
        out.append("Stages:")
        rows = [["STAGE", "PHASE", "UPGRADED", "FAILED", ""]]
        for s in snap.stages:
            mark = "<- current" if s.name == snap.current_stage else ""
            rows.append([s.name, s.phase, f"{s.upgraded}/{s.total}", str(s.failed), mark])
        out.extend(_table(rows))
    if snap.in_flight:
        out.append(f"In flight ({len(snap.in_flight)}):")
        rows = [["CLUSTER", "STAGE", "PHASE", "STEP"]]
        rows += [[c.cluster, c.stage, c.phase, c.step] for c in snap.in_flight]
        out.extend(_table(rows))
    for title, items in (("Failed", snap.failed), ("Blocked", snap.blocked)):
        if not items:
            continue
        out.append(f"{title} ({len(items)}):")
        for c in items:
            why = ": ".join(p for p in (c.reason, c.message) if p) or "no reason recorded"
            attempt = f", attempt {c.attempt}" if c.attempt else ""
            out.append(f"  {c.cluster} (stage {c.stage}{attempt}): {why}")
        if title == "Failed":
            ids = " ".join(c.cluster for c in items)
            out.append(f"  retry: fleet-orchestrator retry {snap.name} {ids}")
            out.append(f"  or skip: fleet-orchestrator skip {snap.name} {ids}")
    waiting = [s.name for s in snap.stages if s.phase == api.StagePhase.AWAITING_APPROVAL]
    for stage in waiting:
        out.append(f"Stage {stage} awaits approval: fleet-orchestrator approve {snap.name} {stage}")
    if snap.approved:
        out.append(f"Approved stages: {', '.join(snap.approved)}")
    return "\n".join(out) + "\n"


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
    return "\n".join(_table(rows, indent="")) + "\n"


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


def _merge_annotation(kube: KubeClient, target: _Target, key: str, values: Iterable[str]) -> str:
    """Add values to a comma-separated annotation, keeping what is there; the new value."""
    current = ((target.obj.get("metadata") or {}).get("annotations") or {}).get(key)
    merged = _csv(current)
    merged += [v for v in values if v not in merged]
    value = ",".join(merged)
    kube.merge_patch(
        target.plural, target.namespace, target.name, {"metadata": {"annotations": {key: value}}}
    )
    return value


def _stage_names(kube: KubeClient, target: _Target) -> list[str]:
    strategy = ((target.obj.get("spec") or {}).get("strategy")) or {}
    names = [str(s["name"]) for s in strategy.get("stages") or []]
    if not names:
        run = _current_run(kube, target)
        names = [str(s["name"]) for s in ((run or {}).get("status") or {}).get("stages") or []]
    return names


def approve(kube: KubeClient, namespace: str, name: str, stage: str) -> str:
    """Add STAGE to the approve-stages annotation; a line saying what was done."""
    target = _resolve(kube, namespace, name)
    stages = _stage_names(kube, target)
    if stage not in stages:
        raise OperateError(
            f"{target.kind} {name!r} has no stage {stage!r}: "
            f"its stages are {', '.join(stages) or '(none: spec.strategy.stages is empty)'}"
        )
    value = _merge_annotation(kube, target, api.ANNOTATION_APPROVE_STAGES, [stage])
    return f"{target.kind} {namespace}/{name}: {api.ANNOTATION_APPROVE_STAGES}={value}"


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


def _mark_clusters(
    kube: KubeClient, namespace: str, name: str, clusters: list[str], key: str, verb: str
) -> tuple[str, list[str]]:
    target = _resolve(kube, namespace, name)
    phases = _cluster_phases(kube, target)
    unknown = [c for c in clusters if c not in phases]
    if unknown:
        known = sorted(phases)
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        raise OperateError(
            f"{target.kind} {name!r} has no cluster {', '.join(map(repr, unknown))}: "
            f"its clusters are {shown or '(none yet: wait for the run to start)'}; "
            f"`fleet-orchestrator status {name}` shows them"
        )
    notes: list[str] = []
    if verb == "retry":
        notes = [
            f"note: {c} is {phases[c]}, not Failed: retry does nothing to it"
            for c in clusters
            if phases[c] != api.UpgradePhase.FAILED
        ]
    value = _merge_annotation(kube, target, key, clusters)
    return f"{target.kind} {namespace}/{name}: {key}={value}", notes


def retry(
    kube: KubeClient, namespace: str, name: str, clusters: list[str]
) -> tuple[str, list[str]]:
    """Add clusters to retry-clusters; a line saying what was done and notes."""
    return _mark_clusters(kube, namespace, name, clusters, api.ANNOTATION_RETRY_CLUSTERS, "retry")


def skip(kube: KubeClient, namespace: str, name: str, clusters: list[str]) -> tuple[str, list[str]]:
    """Add clusters to skip-clusters; a line saying what was done and notes."""
    return _mark_clusters(kube, namespace, name, clusters, api.ANNOTATION_SKIP_CLUSTERS, "skip")


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


def _context_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, like kubectl; else default."""
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
                return str((ctx.get("context") or {}).get("namespace") or "default")
    return "default"


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
    for verb, what in (
        ("retry", "retry Failed clusters (a new attempt)"),
        ("skip", "skip clusters: the run does not upgrade them"),
    ):
        p = sub.add_parser(verb, help=what)
        _common(p)
        p.add_argument("name", help="ClusterVersion or UpdateRun")
        p.add_argument("clusters", nargs="+", metavar="CLUSTER", help="cluster id")
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
    namespace = args.namespace or _context_namespace(args.kubeconfig)
    try:
        kube = KubeClient(args.kubeconfig)
    except Exception as error:  # kubeconfig loading raises several kinds
        print(
            f"error: cannot load the kubeconfig ({error}); pass --kubeconfig FILE",
            file=sys.stderr,
        )
        return 1
    try:
        return _dispatch(kube, namespace, args, out)
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


def _dispatch(kube: KubeClient, namespace: str, args: argparse.Namespace, out: TextIO) -> int:
    command = args.command
    if command == "status":
        read = _status_reader(kube, namespace, args.name)
        if args.watch:
            _watch(read, out, args.interval)
        else:
            out.write(read())
    elif command == "history":
        out.write(render_history(namespace, args.name, _history(kube, namespace, args.name)))
    elif command == "approve":
        print(approve(kube, namespace, args.name, args.stage), file=out)
    elif command in ("retry", "skip"):
        fn = retry if command == "retry" else skip
        line, notes = fn(kube, namespace, args.name, args.clusters)
        print(line, file=out)
        for note in notes:
            print(note, file=sys.stderr)
    else:
        state = api.RunState.STOP if command == "stop" else api.RunState.RUN
        print(set_state(kube, namespace, args.name, state), file=out)
    return 0


def _status_reader(kube: KubeClient, namespace: str, name: str | None) -> Callable[[], str]:
    if name:
        return lambda: render(snapshot(kube, namespace, name))

    def every() -> str:
        cvs, _ = kube.list_objects(api.PLURAL, namespace)
        runs, _ = kube.list_objects(api.UPDATE_RUN_PLURAL, namespace)
        names = [o["metadata"]["name"] for o in cvs]
        names += [
            o["metadata"]["name"]
            for o in runs
            if api.LABEL_CLUSTER_VERSION not in (o["metadata"].get("labels") or {})
        ]
        if not names:
            return f"no ClusterVersions or UpdateRuns in namespace {namespace}\n"
        return "\n".join(render(snapshot(kube, namespace, n)) for n in names)

    return every


def _watch(read_once: Callable[[], str], out: TextIO, interval: float) -> None:
    """Re-render whenever what `read` returns changes: live on a terminal, appended otherwise.

    A failed read (the apiserver away, the object deleted) is shown and read again.
    """

    def read() -> str:
        try:
            return read_once()
        except (OperateError, KubeError) as error:
            return f"error: {error} (reading again every {interval:g}s; Ctrl-C to leave)\n"

    if out.isatty():
        try:
            from rich.console import Console  # noqa: PLC0415
            from rich.live import Live  # noqa: PLC0415
            from rich.text import Text  # noqa: PLC0415
        except ImportError:
            pass
        else:
            text = read()
            with Live(Text(text), console=Console(file=out), auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    new = read()
                    if new != text:
                        text = new
                        live.update(Text(text), refresh=True)
    last = ""
    while True:
        text = read()
        if text != last:
            stamp = time.strftime("%H:%M:%S", time.gmtime())
            out.write(f"--- {stamp} UTC\n{text}")
            out.flush()
            last = text
        time.sleep(interval)
