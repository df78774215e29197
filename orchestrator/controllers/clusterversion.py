"""The ClusterVersion controller: desired state → its UpdateRun (create, supersede, history).

A ClusterVersion's targets and strategy name one run (`initialize.run_name`): when they change,
a new run is created and every other unfinished run of the ClusterVersion is set to Stop (its
clusters in flight finish their step and are serviced back in before the new run may take
them: one owner). The floor and `paused` are applied to the current run in place. People's
annotations (approve, retry, skip) are handed to the current run. Status is the current run's
summary plus the recent runs; finished runs beyond the history limit are deleted.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from orchestrator import api
from orchestrator.adapters.cache import AccessCatalog, ObjectCache
from orchestrator.adapters.kube import Conflict, KubeClient, KubeError, NotFound
from orchestrator.engine.conditions import blocking_condition, get_condition, set_condition
from orchestrator.engine.initialize import live_fields, run_for, superseded
from orchestrator.engine.requester import COPIED, MOVED, handed, handover
from orchestrator.engine.validate import Problem, SpecCache, validate_spec
from orchestrator.pipeline import deletion

__all__ = ["DEFAULT_HISTORY", "ClusterVersionController"]

log = logging.getLogger(__name__)
#: Finished runs kept per ClusterVersion (the current one is always kept).
DEFAULT_HISTORY = 10
#: Runs pruned as history: finished (api.FINISHED_PHASES), or Invalid.
_FINISHED = {p.value for p in api.FINISHED_PHASES | {api.RunPhase.INVALID}}
#: On a run the ClusterVersion controller stopped because the ClusterVersion became invalid
#: (or its provider stopped allowing the namespace): it resumes when that is fixed.
ANNOTATION_STOPPED_FOR = f"{api.GROUP}/stopped-for"
_PHASE = {
    api.RunPhase.INITIALIZING.value: api.RolloutPhase.PENDING,
    api.RunPhase.PROGRESSING.value: api.RolloutPhase.PROGRESSING,
    api.RunPhase.STOPPING.value: api.RolloutPhase.PAUSED,
    api.RunPhase.STOPPED.value: api.RolloutPhase.PAUSED,
    api.RunPhase.HALTED.value: api.RolloutPhase.HALTED,
    api.RunPhase.SUCCEEDED.value: api.RolloutPhase.COMPLETED,
    api.RunPhase.FAILED.value: api.RolloutPhase.FAILED,
    api.RunPhase.INVALID.value: api.RolloutPhase.INVALID,
}
#: Annotations a new run starts with, as its ClusterVersion has them (retry and skip are handed
#: by engine.requester.handover once the run exists).
_COPIED = (*COPIED, api.ANNOTATION_REASON, api.ANNOTATION_REQUESTED_BY)


@dataclass
class ClusterVersionController:
    """Reconciles ClusterVersions into UpdateRuns."""

    kube: KubeClient
    runs: ObjectCache
    upgrades: ObjectCache
    #: FleetProviders, MetricSources and the policy: what this namespace's spec may use.
    catalog: AccessCatalog
    #: The ClusterVersions' watch cache, read instead of a GET per reconcile (at 5,000 clusters
    #: a ClusterVersion is ~250 KB and one GET costs the apiserver ~70 ms of CPU); it holds the
    #: version whose event scheduled this reconcile, and our own writes go through it.
    cvs: ObjectCache
    history: int = DEFAULT_HISTORY
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: The ClusterVersions' parsed specs, checks and runs, per generation.
    _specs: SpecCache = field(default_factory=SpecCache)

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Make the ClusterVersion's run exist and the others stop; summarise."""
        cv = self.cvs.get(namespace, name)
        if cv is None:
            return None
        meta = cv["metadata"]
        gen = int(meta.get("generation", 1))
        now = self.clock()
        status = _cv_status(cv)
        mine = sorted(
            self.runs.by_label(namespace, name),
            key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"]["name"]),
        )
        if deletion.deleting(cv):
            return self._delete(cv, status, mine, gen, now)
        if not deletion.has_finalizer(cv):
            # Added on first sight (also to ClusterVersions applied before finalizers).
            try:
                cv = self.kube.add_finalizer(api.PLURAL, cv)
            except KubeError as err:  # deleted meanwhile: the next event says so
                log.info("no finalizer on ClusterVersion %s: %s", name, err)
                return 1.0
            self.cvs.put(cv)
        parsed = self._specs.parse(api.ClusterVersionSpec, cv)
        problems: list[Problem] = (
            parsed
            if isinstance(parsed, list)
            else list(self._specs.get(cv, "validate", lambda: validate_spec(parsed)))
        )
        if not isinstance(parsed, list):
            # Who may do what (orchestrator.engine.access): refused before any run is created.
            access = self.catalog.check(namespace, parsed)
            if isinstance(access, list):
                problems = [*access, *problems]
        if isinstance(parsed, list) or problems:
            # Invariant 7: a spec error stops the current run (its clusters in flight are
            # serviced back in first) and says what is wrong; nothing new starts.
            for run in self._superseded(mine, ""):
                self._stop(run, invalid=True)
            text = "; ".join(str(p) for p in problems[:5])
            conds = set_condition(
                list(status.conditions or []), "Ready", False, "InvalidSpec", text, gen, now
            )
            self._write(
                cv,
                status.model_copy(
                    update={
                        "phase": api.RolloutPhase.INVALID,
                        "message": text,
                        "conditions": conds,
                        "observed_generation": gen,
                        "runs": _history(mine) or None,
                    }
                ),
            )
            return None
        spec = parsed
        run_name, run_spec = self._specs.get(
            cv, f"run:{name}", lambda: run_for(name, gen, spec, spec.timeouts)
        )
        run_spec = run_spec.model_copy(
            update={"skip": spec.skip, "retry": spec.retry, "notifications": spec.notifications}
        )
        current = next((r for r in mine if r["metadata"]["name"] == run_name), None)
        if current is None:
            current = self._create(cv, run_name, run_spec)
            if current is None:
                return 1.0
            mine.append(current)
        for run in self._superseded(mine, run_name):
            self._stop(run)
        self._resume_if_stopped_for_invalid(current)
        self._apply_live(cv, current, spec)
        self._prune(namespace, mine, current)
        return self._summarise(cv, status, current, mine, gen, now)

    def _create(
        self, cv: dict[str, Any], name: str, spec: api.UpdateRunSpec
    ) -> dict[str, Any] | None:
        meta = cv["metadata"]
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k in _COPIED}
        annotations.update(handed(meta.get("annotations") or {}, cv.get("spec")))
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.UPDATE_RUN_KIND,
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {api.LABEL_CLUSTER_VERSION: meta["name"]},
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": api.API_VERSION,
                        "kind": api.KIND,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
                "finalizers": [api.FINALIZER],
            },
            "spec": spec.dump(),
        }
        try:
            obj = self.kube.create_object(api.UPDATE_RUN_PLURAL, meta["namespace"], body)
        except Conflict:
            try:
                obj = self.kube.get_object(api.UPDATE_RUN_PLURAL, meta["namespace"], name)
            except KubeError:
                return None
        self.runs.put(obj)
        return obj

    def _delete(
        self,
        cv: dict[str, Any],
        status: api.ClusterVersionStatus,
        mine: list[dict[str, Any]],
        gen: int,
        now: datetime,
    ) -> float | None:
        """A ClusterVersion being deleted: its runs are deleted (each brings its clusters back
        into service before it goes, orchestrator.controllers.updaterun) and it goes once none is
        left. Deleted with --cascade=orphan, its runs stay (the garbage collector unlinks them) and
        it goes."""
        meta = cv["metadata"]
        # Its runs are those it owns: once the garbage collector has orphaned them (and removed
        # its "orphan" finalizer) they are no longer its to delete.
        mine = [r for r in mine if deletion.owned_by(r, meta["uid"])]
        if mine and not deletion.orphaning(cv):
            for run in mine:
                if deletion.deleting(run):
                    continue
                with contextlib.suppress(NotFound):
                    self.kube.delete_object(
                        api.UPDATE_RUN_PLURAL, meta["namespace"], run["metadata"]["name"]
                    )
            names = ", ".join(r["metadata"]["name"] for r in mine)
            message = (
                f"being deleted: waiting for UpdateRun(s) {names} to bring their clusters "
                "back into service and go"
            )
            conds = set_condition(
                list(status.conditions or []), "Deleting", True, "WaitingForRuns", message, gen, now
            )
            self._write(cv, status.model_copy(update={"message": message, "conditions": conds}))
            return 5.0  # and on every change of its runs (the controller's watch)
        if deletion.has_finalizer(cv):
            written = self.kube.remove_finalizer(api.PLURAL, cv)
            if written is not None:
                self.cvs.put(written, deleted=deletion.released(written))
            log.info("ClusterVersion %s/%s: no run left; finalizer removed", *_key(cv))
        return None

    @staticmethod
    def _superseded(mine: list[dict[str, Any]], current: str) -> list[dict[str, Any]]:
        """The runs to stop (initialize.superseded, which the simulation calls too)."""
        names = set(
            superseded(
                (
                    (
                        r["metadata"]["name"],
                        (r.get("spec") or {}).get("state"),
                        (r.get("status") or {}).get("phase"),
                    )
                    for r in mine
                ),
                current,
            )
        )
        return [r for r in mine if r["metadata"]["name"] in names]

    def _stop(self, run: dict[str, Any], invalid: bool = False) -> None:
        """Stop a run; `invalid`: because the ClusterVersion is invalid (or no longer allowed),
        recorded so that the run resumes once the ClusterVersion is valid again."""
        patch: dict[str, Any] = {"spec": {"state": api.RunState.STOP.value}}
        if invalid:
            patch["metadata"] = {"annotations": {ANNOTATION_STOPPED_FOR: "InvalidSpec"}}
        self._patch(run, patch)

    def _resume_if_stopped_for_invalid(self, run: dict[str, Any]) -> None:
        """The run this ClusterVersion wants was stopped only because the ClusterVersion was
        invalid (or its provider access revoked): now that it is valid, the run goes on. A
        run a person stopped carries no such mark and stays stopped."""
        annotations = run["metadata"].get("annotations") or {}
        if ANNOTATION_STOPPED_FOR not in annotations:
            return
        self._patch(
            run,
            {
                "spec": {"state": api.RunState.RUN.value},
                "metadata": {"annotations": {ANNOTATION_STOPPED_FOR: None}},
            },
        )

    def _apply_live(
        self, cv: dict[str, Any], run: dict[str, Any], spec: api.ClusterVersionSpec
    ) -> None:
        """Floor, paused, spec.skip/retry/notifications and people's annotations go to the
        current run in place."""
        patch: dict[str, Any] = {}
        rspec = run.get("spec") or {}
        for key, value in live_fields(rspec, spec).items():
            # A JSON merge patch of the stored spec: nested objects (skip, retry) are replaced
            # exactly; strategy gets its paused field only.
            replacing = key not in ("requiredAvailableCount", "strategy")
            patch.setdefault("spec", {})[key] = (
                _replacing(rspec.get(key), value) if replacing else value
            )
        cv_ann = cv["metadata"].get("annotations") or {}
        run_ann = run["metadata"].get("annotations") or {}
        # The requests, and who asked with them (engine.requester.handover).
        said = handover(cv_ann, cv.get("spec"), run_ann, "spec" in patch)
        if said:
            patch.setdefault("metadata", {})["annotations"] = said
        moved = [k for k in MOVED if cv_ann.get(k)]
        if patch:
            self._patch(run, patch)
        if moved:  # consumed from the ClusterVersion once the run has them
            meta = cv["metadata"]
            try:
                answer = self.kube.merge_patch(
                    api.PLURAL,
                    meta["namespace"],
                    meta["name"],
                    {"metadata": {"annotations": dict.fromkeys(moved)}},
                )
                self.cvs.put(answer)  # consumed: no later pass may hand them over again
            except KubeError as err:
                log.info("could not move annotations of %s: %s", meta["name"], err)

    def _patch(self, run: dict[str, Any], patch: dict[str, Any]) -> None:
        meta = run["metadata"]
        try:
            self.runs.put(
                self.kube.merge_patch(api.UPDATE_RUN_PLURAL, meta["namespace"], meta["name"], patch)
            )
        except KubeError as err:
            log.info("could not update UpdateRun %s: %s", meta["name"], err)

    def _prune(self, namespace: str, mine: list[dict[str, Any]], current: dict[str, Any]) -> None:
        finished = [
            r
            for r in mine
            if r is not current
            and (r.get("status") or {}).get("phase") in _FINISHED
            and not deletion.deleting(r)  # pruned already: its finalizer is being released
        ]
        for run in finished[: max(0, len(finished) - self.history)]:
            name = run["metadata"]["name"]
            # No garbage collector is assumed: delete the run's ClusterUpgrades ourselves (a
            # finished run holds nothing out of service: its finalizers go at once,
            # controllers/updaterun.py).
            for child in self.upgrades.by_label(namespace, name):
                with contextlib.suppress(NotFound):
                    self.kube.delete_object(
                        api.CLUSTER_UPGRADE_PLURAL, namespace, child["metadata"]["name"]
                    )
                self.upgrades.put(child, deleted=True)
            with contextlib.suppress(NotFound):
                self.kube.delete_object(api.UPDATE_RUN_PLURAL, namespace, name)
            self.runs.put(run, deleted=True)
            mine.remove(run)

    def _summarise(
        self,
        cv: dict[str, Any],
        status: api.ClusterVersionStatus,
        run: dict[str, Any],
        mine: list[dict[str, Any]],
        gen: int,
        now: datetime,
    ) -> float | None:
        rs = run.get("status") or {}
        try:
            run_status = api.UpdateRunStatus.model_validate(rs)
        except ValidationError:
            run_status = api.UpdateRunStatus()
        counts = run_status.counts or api.RunCounts()
        phase = _PHASE.get(
            run_status.phase.value if run_status.phase else "", api.RolloutPhase.PENDING
        )
        message = run_status.message or "run starting"
        stop = blocking_condition(run_status.conditions)
        if stop is not None and stop.message not in message:
            # What stops the run leads (`kubectl get cv -o wide`, the Ready and Progressing
            # conditions), not "run starting" (issue 24).
            message = f"cannot progress: {stop.reason}: {stop.message}"
        by_phase = {
            k: v
            for k, v in {
                "Pending": counts.pending,
                "InFlight": counts.in_flight,
                "Upgraded": counts.upgraded,
                "Failed": counts.failed,
                "Blocked": counts.blocked,
                "Skipped": counts.skipped,
            }.items()
            if v
        }
        summary = api.Summary(
            total=counts.total,
            up_to_date=counts.upgraded + counts.skipped,
            in_flight=counts.in_flight,
            failed=counts.failed,
            by_phase=by_phase or None,
        )
        conds = list(status.conditions or [])
        done = phase == api.RolloutPhase.COMPLETED
        # An invalid run says so with the same reason as an invalid ClusterVersion spec.
        ready_reason = "InvalidSpec" if phase == api.RolloutPhase.INVALID else phase.value
        conds = set_condition(conds, "Ready", done, ready_reason, message, gen, now)
        conds = set_condition(
            conds,
            "Progressing",
            phase == api.RolloutPhase.PROGRESSING,
            phase.value,
            message,
            gen,
            now,
        )
        # The run's own Degraded (plugin unreachable, TLS or Secret trouble) comes first: it is
        # what stops the run; failed clusters are the other way a rollout is degraded.
        run_degraded = get_condition(run_status.conditions, "Degraded")
        if run_degraded is not None and run_degraded.status == "True":
            conds = set_condition(
                conds, "Degraded", True, run_degraded.reason, run_degraded.message, gen, now
            )
        else:
            conds = set_condition(
                conds,
                "Degraded",
                counts.failed > 0,
                "ClusterFailed" if counts.failed else "AsExpected",
                f"{counts.failed} cluster(s) failed" if counts.failed else "no failures",
                gen,
                now,
            )
        new = status.model_copy(
            update={
                "observed_generation": gen,
                "phase": phase,
                "message": message,
                "current_run": run["metadata"]["name"],
                "current_stage": run_status.current_stage,
                "summary": summary,
                "stages": run_status.stages,
                "runs": _history(mine) or None,
                "conditions": conds,
            }
        )
        self._write(cv, new)
        return None

    def _write(self, cv: dict[str, Any], status: api.ClusterVersionStatus) -> None:
        body = status.dump()
        if body == (cv.get("status") or {}):
            return
        meta = cv["metadata"]
        try:
            written = self.kube.write_status(
                api.PLURAL, meta["namespace"], meta["name"], body, meta["resourceVersion"]
            )
            self.cvs.put(written)
        except Conflict:
            log.debug("ClusterVersion %s changed meanwhile; next reconcile writes", meta["name"])


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _history(runs: list[dict[str, Any]]) -> list[api.RunRecord]:
    out = []
    for run in reversed(runs):
        st = run.get("status") or {}
        out.append(
            api.RunRecord(
                name=run["metadata"]["name"],
                phase=st.get("phase"),
                start_time=st.get("startTime"),
                end_time=st.get("endTime"),
                message=st.get("message"),
            )
        )
    return out


def _cv_status(cv: dict[str, Any]) -> api.ClusterVersionStatus:
    try:
        return api.ClusterVersionStatus.model_validate(cv.get("status") or {})
    except ValidationError:
        return api.ClusterVersionStatus()


def _replacing(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) value that turns old into exactly new."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict.fromkeys(k for k in old if k not in new)
        out.update({k: _replacing(old.get(k), v) for k, v in new.items()})
        return out
    return new
