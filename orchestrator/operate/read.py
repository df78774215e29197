"""The read model of the operator verbs: a name resolved to its ClusterVersion or UpdateRun, and
what `status` (Snapshot) and `history` show of it, read like kubectl reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

from pydantic import ValidationError

from orchestrator import api
from orchestrator.adapters.kube import KubeClient, NotFound
from orchestrator.engine.conditions import blocking_condition, partly_degraded
from orchestrator.engine.conditions import fix_for as condition_fix
from orchestrator.engine.decide import step_of

__all__ = [
    "CV",
    "IN_FLIGHT",
    "RUN",
    "ClusterLine",
    "OperateError",
    "Outcome",
    "Snapshot",
    "StageLine",
    "Target",
    "UpgradeCache",
    "Upgrades",
    "WaitCode",
    "cause",
    "comma_list",
    "current_run",
    "fix_for",
    "history",
    "list_upgrades",
    "resolve",
    "snapshot",
    "wait_outcome",
]


_HOOK_PHASES = frozenset({api.UpgradePhase.PRE_HOOK.value, api.UpgradePhase.POST_HOOK.value})


CV = "ClusterVersion"


RUN = "UpdateRun"


IN_FLIGHT = frozenset(
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


@dataclass(frozen=True)
class Target:
    kind: str
    plural: str
    namespace: str
    name: str
    obj: dict[str, Any]


def resolve(kube: KubeClient, namespace: str, name: str) -> Target:
    """The ClusterVersion named NAME, else the UpdateRun named NAME."""
    for kind, plural in ((CV, api.PLURAL), (RUN, api.UPDATE_RUN_PLURAL)):
        try:
            obj = kube.get_object(plural, namespace, name)
        except NotFound:
            continue
        return Target(kind, plural, namespace, name, obj)
    raise OperateError(
        f"no ClusterVersion or UpdateRun named {name!r} in namespace {namespace!r}: "
        f"list them with `kubectl get clusterversions,updateruns -n {namespace}`, "
        "or pass --namespace"
    )


def current_run(kube: KubeClient, target: Target) -> dict[str, Any] | None:
    """The UpdateRun a target stands for: itself, or a ClusterVersion's status.currentRun."""
    if target.kind == RUN:
        return target.obj
    run_name = (target.obj.get("status") or {}).get("currentRun")
    if not run_name:
        return None
    try:
        return kube.get_object(api.UPDATE_RUN_PLURAL, target.namespace, run_name)
    except NotFound:
        return None


def list_upgrades(kube: KubeClient, namespace: str, run_name: str) -> list[dict[str, Any]]:
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
    #: Upgraded by this run (skipped clusters are counted apart, not as upgraded).
    upgraded: int
    #: Failed, and Blocked where that counts against the budget (engine.decide.counts_as_failure).
    failed: int
    max_failures: int | None = None
    skipped: int = 0


@dataclass(frozen=True)
class ClusterLine:
    """One cluster in flight, failed or blocked."""

    cluster: str
    stage: str
    phase: str
    step: str = ""
    #: status.attempt as stored: 0 for the first attempt (people are shown attempt + 1).
    attempt: int = 0
    reason: str = ""
    message: str = ""
    #: When its current step (else its phase) started, RFC 3339; "" when unknown.
    since: str = ""
    #: The FleetProvider it belongs to (spec.providerName); "" for spec.opsEndpoint runs.
    provider: str = ""


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
    #: Per FleetProvider of the run (spec.providerName of its ClusterUpgrades): its clusters
    #: and how many of them are upgraded, by name; empty when none names one.
    providers: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: A provider of several that does not answer ("Reason: message" of the run's Degraded
    #: condition, engine.conditions.partly_degraded): shown beside the progress, not as a stop.
    degraded: str = ""
    #: Why the run cannot progress ("Reason: message" of its blocking condition), and the fix.
    cause: str = ""
    fix: str = ""
    #: The moment ages and "in 2h5m" are measured from.
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def _step(cu_status: Mapping[str, Any]) -> str:
    """The step on record, a running hook as one, and the node pools chained after it
    (status.nextRequestIds: "nodePool/a, then b, c"; the step on record stays the chain's
    first while the others run)."""
    step = str(cu_status.get("step") or _hook_step(cu_status.get("hook")))
    chained = [step_of(str(rid)).partition("/")[2] for rid in cu_status.get("nextRequestIds") or ()]
    return f"{step}, then {', '.join(chained)}" if step and chained else step


def _hook_step(hook: Any) -> str:
    """A running hook as a step: "preUpgrade Running"."""
    if not isinstance(hook, dict) or not hook.get("kind"):
        return ""
    return f"{hook['kind']} {hook.get('phase') or api.HookPhase.RUNNING.value}"


def comma_list(value: str | None) -> list[str]:
    """The items of a comma-separated annotation value."""
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def snapshot(
    kube: KubeClient, namespace: str, name: str, upgrades: Upgrades | None = None
) -> Snapshot:
    """Read a ClusterVersion (and its current run) or an UpdateRun, and its ClusterUpgrades
    (listed, or from `upgrades`, e.g. an UpgradeCache)."""
    target = resolve(kube, namespace, name)
    read = upgrades or (lambda run: list_upgrades(kube, namespace, run))
    status = target.obj.get("status") or {}
    run = current_run(kube, target)
    run_status = (run or {}).get("status") or {}
    run_name = str((run or {}).get("metadata", {}).get("name", ""))
    lines: dict[str, list[ClusterLine]] = {"in_flight": [], "failed": [], "blocked": []}
    providers: dict[str, tuple[int, int]] = {}
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
            step=_step(cu_status),
            attempt=int(cu_status.get("attempt") or 0),
            reason=str(cu_status.get("reason") or ""),
            message=str(cu_status.get("message") or ""),
            provider=str(spec.get("providerName") or ""),
            since=str(
                cu_status.get("stepStartTime")
                or (phase in _HOOK_PHASES and (cu_status.get("hook") or {}).get("startTime"))
                or cu_status.get("lastTransitionTime")
                or cu_status.get("startTime")
                or ""
            ),
        )
        if line.provider:
            total, done = providers.get(line.provider, (0, 0))
            providers[line.provider] = (total + 1, done + (phase == api.UpgradePhase.UPGRADED))
        if phase in IN_FLIGHT:
            lines["in_flight"].append(line)
        elif phase == api.UpgradePhase.FAILED:
            lines["failed"].append(line)
        elif phase == api.UpgradePhase.BLOCKED:
            lines["blocked"].append(line)
    stages = run_status.get("stages") or status.get("stages") or []
    annotations = (target.obj.get("metadata") or {}).get("annotations") or {}
    failures = run_status.get("failures")
    blocked = cause(run_status, status)
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
        stages=tuple(_stage_line(s) for s in stages),
        in_flight=tuple(lines["in_flight"]),
        failed=tuple(lines["failed"]),
        blocked=tuple(lines["blocked"]),
        approved=tuple(comma_list(annotations.get(api.ANNOTATION_APPROVE_STAGES))),
        skipped_stages=tuple(
            dict.fromkeys(
                [
                    *comma_list(annotations.get(api.ANNOTATION_SKIP_STAGES)),
                    *(((target.obj.get("spec") or {}).get("skip") or {}).get("stages") or []),
                ]
            )
        ),
        failures=api.FailureSummary.model_validate(failures) if failures else None,
        next_start_time=str(run_status.get("nextStartTime") or ""),
        waiting_reason=str(run_status.get("waitingReason") or ""),
        providers=providers,
        degraded=_partly_degraded(run_status, status),
        cause=blocked,
        fix=fix_for(blocked),
    )


def _stage_line(stage: Mapping[str, Any]) -> StageLine:
    """A stage of the run's status as stored (engine.decide counts it: upgraded and skipped
    apart, failed as the budget counts), the same numbers `kubectl get ur -o yaml` shows."""
    return StageLine(
        name=str(stage["name"]),
        phase=str(stage.get("phase", "")),
        total=int(stage.get("total", 0)),
        upgraded=int(stage.get("upgraded", 0)),
        failed=int(stage.get("failed", 0)),
        max_failures=None if stage.get("maxFailures") is None else int(stage["maxFailures"]),
        skipped=int(stage.get("skipped", 0)),
    )


def history(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """status.runs of the ClusterVersion, plus its UpdateRuns the history does not list."""
    target = resolve(kube, namespace, name)
    if target.kind != CV:
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


class WaitCode(IntEnum):
    """The exit codes of `fleet-orchestrator wait` (README and docs/operations.md list them)."""

    #: The run succeeded (--for completed) or the stage completed (--for stage=NAME).
    REACHED = 0
    #: The request could not be made: no such object or stage, the apiserver refused.
    ERROR = 1
    HALTED = 3
    #: The run ended with failed clusters (onFailure: Continue), or the stage failed.
    FAILED = 4
    INVALID = 5
    #: It will not get there by itself: the run was stopped or superseded, the stage skipped.
    STOPPED = 6
    #: --timeout passed first (as GNU timeout exits).
    TIMEOUT = 124


#: What a run's phase means for `wait`; phases not listed are still on the way.
_RUN_ENDS = {
    api.RunPhase.SUCCEEDED.value: WaitCode.REACHED,
    api.RunPhase.HALTED.value: WaitCode.HALTED,
    api.RunPhase.FAILED.value: WaitCode.FAILED,
    api.RunPhase.INVALID.value: WaitCode.INVALID,
    api.RunPhase.STOPPED.value: WaitCode.STOPPED,
}


#: Stages that are done for `wait --for stage=NAME` (Soaking: completed, soaking before the
#: next stage opens).
_STAGE_DONE = frozenset({api.StagePhase.COMPLETED.value, api.StagePhase.SOAKING.value})


@dataclass(frozen=True)
class Outcome:
    """Where `wait` ends: its exit code and the line that says why."""

    code: WaitCode
    line: str


def cause(*statuses: Mapping[str, Any]) -> str:
    """Why a run cannot progress (engine.conditions.blocking_condition), from the first of
    the statuses that says it, as "Reason: message"; "" when nothing stops it."""
    return _first_condition(blocking_condition, statuses)


def _partly_degraded(*statuses: Mapping[str, Any]) -> str:
    """A Degraded condition that leaves the run going (engine.conditions.partly_degraded), from
    the first of the statuses that has one, as "Reason: message"; "" when none has."""
    return _first_condition(partly_degraded, statuses)


def _first_condition(
    pick: Callable[[list[api.Condition]], api.Condition | None],
    statuses: Sequence[Mapping[str, Any]],
) -> str:
    for status in statuses:
        try:
            conditions = [api.Condition.model_validate(c) for c in status.get("conditions") or []]
        except ValidationError:
            continue
        found = pick(conditions)
        if found is not None:
            return f"{found.reason}: {found.message}" if found.message else found.reason
    return ""


def fix_for(text: str) -> str:
    """The fix of a cause ("Reason: message"), unless its message already says one ("; ...")."""
    reason, _, message = text.partition(": ")
    return condition_fix(reason, message)


def _observed(obj: Mapping[str, Any]) -> bool:
    """Whether the object's status speaks of its current spec (not of the one before an edit)."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    return status.get("observedGeneration") is not None and (
        generation is None or status.get("observedGeneration") == generation
    )


def _stage_names(obj: Mapping[str, Any]) -> list[str]:
    stages = (((obj.get("spec") or {}).get("strategy") or {}).get("stages")) or []
    return [str(s.get("name")) for s in stages if isinstance(s, dict)]


def wait_outcome(kube: KubeClient, namespace: str, name: str, stage: str | None) -> Outcome | None:
    """Whether what `wait` waits for has happened: the run of NAME (a ClusterVersion's current
    run, or the UpdateRun NAME) ended, or its stage STAGE completed; None while on the way.

    A status that does not yet speak of the current spec (observedGeneration behind) is on the
    way: a wait right after `kubectl apply` never ends on the previous run's outcome."""
    target = resolve(kube, namespace, name)
    names = _stage_names(target.obj)
    if stage is not None and names and stage not in names:
        raise OperateError(
            f"--for stage={stage}: {target.kind} {name} has no stage {stage!r}; "
            f"its stages are {', '.join(names)}"
        )
    if not _observed(target.obj):
        return None
    cv_status = target.obj.get("status") or {}
    if target.kind == CV and cv_status.get("phase") == api.RolloutPhase.INVALID.value:
        return Outcome(WaitCode.INVALID, f"{CV} {name} is Invalid: {cv_status.get('message')}")
    run = current_run(kube, target)
    if run is None or not _observed(run):
        return None
    run_status = run.get("status") or {}
    run_name = run["metadata"]["name"]
    what = f"{target.kind} {name}" + (f" (run {run_name})" if target.kind == CV else "")
    phase = str(run_status.get("phase") or "")
    said = str(run_status.get("message") or "")
    if stage is not None:
        stage_phase = next(
            (
                str(s.get("phase") or "")
                for s in run_status.get("stages") or []
                if s.get("name") == stage
            ),
            "",
        )
        if stage_phase in _STAGE_DONE:
            return Outcome(WaitCode.REACHED, f"{what}: stage {stage} completed")
        if stage_phase == api.StagePhase.SKIPPED.value:
            return Outcome(WaitCode.STOPPED, f"{what}: stage {stage} was skipped")
        if stage_phase == api.StagePhase.FAILED.value:
            return Outcome(WaitCode.FAILED, f"{what}: stage {stage} failed: {said}")
    ends = _RUN_ENDS.get(phase)
    if ends is None:
        return None
    if ends == WaitCode.REACHED and stage is None:
        return Outcome(ends, f"{what} completed: {said}".rstrip(": "))
    if ends == WaitCode.REACHED:  # the run succeeded without the stage reported complete
        return Outcome(WaitCode.STOPPED, f"{what} ended ({phase}) before stage {stage} completed")
    why = cause(run_status, cv_status) or said
    return Outcome(ends, f"{what} is {phase}: {why}".rstrip(": "))
