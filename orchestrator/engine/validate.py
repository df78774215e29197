"""Validation of a ClusterVersion: field-named parse errors, then checks against the fleet."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from orchestrator import api
from orchestrator.engine.health import check_problems
from orchestrator.engine.observations import ClusterObs
from orchestrator.engine.windows import maintenance_problems, parse_time
from plugins.sdk import versions

__all__ = [
    "Problem",
    "SpecCache",
    "Targets",
    "parse_model",
    "parse_spec",
    "resolve_targets",
    "validate_spec",
]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the field path and what to do about it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Target:
    """Where one cluster should end up."""

    version: str
    node_version: str
    pools: Mapping[str, str]
    stage: int

    def pool_target(self, pool: str) -> str:
        """The target version of a node pool."""
        return self.pools.get(pool, self.node_version)


@dataclass(frozen=True)
class Targets:
    """The managed clusters, their targets and stage membership, resolved over an inventory."""

    by_cluster: Mapping[str, Target]
    stage_names: Sequence[str]
    stage_members: Sequence[Sequence[str]]


def _loc(loc: Sequence[int | str]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_spec(raw: Mapping[str, Any] | None) -> api.ClusterVersionSpec | list[Problem]:
    """Parse a raw ClusterVersion spec; on failure, one Problem per bad field with the fix."""
    return parse_model(api.ClusterVersionSpec, raw)


def parse_model(model: type[M], raw: Mapping[str, Any] | None) -> M | list[Problem]:
    """Parse a raw spec of any of our kinds; on failure, one Problem per bad field with the fix."""
    if raw is None:
        return [Problem("spec", "is missing; set requiredAvailableCount, opsEndpoint and clusters")]
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "string_pattern_mismatch":
                msg = f"{e['input']!r} does not match {e['ctx']['pattern']}"
            if e["type"] == "extra_forbidden":
                msg = "is not a known field; remove it or check its spelling"
            problems.append(Problem(_loc(e["loc"]), msg))
        return problems


def validate_spec(spec: api.ClusterVersionSpec) -> list[Problem]:
    """Checks that need no fleet inventory."""
    problems: list[Problem] = []
    for i, cluster in enumerate(spec.clusters or []):
        problems += _version_problems(f"spec.clusters[{i}]", cluster)
    strategy = spec.strategy or api.Strategy()
    stages = strategy.stages or []
    if not spec.clusters and not stages:
        problems.append(
            Problem("spec.clusters", "is empty; list clusters or select them in stages")
        )
    if stages and not spec.version and not spec.clusters:
        problems.append(Problem("spec.version", "is required when stages select clusters by label"))
    names: set[str] = set()
    for i, stage in enumerate(stages):
        where = f"spec.strategy.stages[{i}]"
        if stage.name in names:
            problems.append(Problem(f"{where}.name", f"{stage.name!r} is used twice"))
        names.add(stage.name)
        if stage.clusters is None and stage.selector is None:
            problems.append(Problem(where, "selects nothing; set clusters or selector"))
        problems += _concurrency_problems(f"{where}.maxConcurrency", stage.max_concurrency)
    problems += _concurrency_problems("spec.strategy.maxConcurrency", strategy.max_concurrency)
    problems += _failures_problems("spec.strategy.maxFailures", strategy.max_failures)
    for i, stage in enumerate(stages):
        problems += _failures_problems(f"spec.strategy.stages[{i}].maxFailures", stage.max_failures)
    problems += _people_problems(spec.skip, spec.retry)
    if strategy.not_before is not None:
        try:
            parse_time(strategy.not_before)
        except ValueError as err:
            problems.append(Problem("spec.strategy.notBefore", str(err)))
    blocks = [("spec.healthChecks", spec.health_checks)] + [
        (f"spec.strategy.stages[{i}].healthChecks", st.health_checks) for i, st in enumerate(stages)
    ]
    for where, checks in blocks:
        if checks is not None:
            problems += [Problem(f, m) for f, m in check_problems(where, checks)]
    maintained = [("spec.strategy.maintenance", strategy.maintenance)] + [
        (f"spec.strategy.stages[{i}].maintenance", st.maintenance) for i, st in enumerate(stages)
    ]
    for where, maintenance in maintained:
        if maintenance is not None:
            problems += [Problem(f, m) for f, m in maintenance_problems(where, maintenance)]
    problems += _hook_problems(strategy.hooks)
    listed = len(spec.clusters or [])
    if listed and not stages and spec.required_available_count >= listed:
        problems.append(_floor_problem(spec.required_available_count, listed))
    return problems


def _hook_problems(hooks: api.Hooks | None) -> list[Problem]:
    """A Job hook's template must make a Job the apiserver accepts: caught here, not when the
    first cluster's hook starts (the apiserver's own validation still has the last word)."""
    problems: list[Problem] = []
    for kind, hook in (
        ("preUpgrade", hooks.pre_upgrade if hooks else None),
        ("postUpgrade", hooks.post_upgrade if hooks else None),
    ):
        where = f"spec.strategy.hooks.{kind}"
        if hook is None:
            continue
        if hook.job is None:
            continue
        pod = (hook.job.template.get("template") or {}).get("spec")
        at = f"{where}.job.template.template.spec"
        if not isinstance(pod, dict):
            problems.append(Problem(at, "is required: the Job's pod template (a JobSpec)"))
            continue
        containers = pod.get("containers")
        if not isinstance(containers, list) or not containers:
            problems.append(Problem(f"{at}.containers", "needs at least one container"))
        elif not all(isinstance(c, dict) and c.get("name") for c in containers):
            problems.append(Problem(f"{at}.containers", "every container needs a name"))
        if pod.get("restartPolicy") not in ("Never", "OnFailure"):
            problems.append(
                Problem(f"{at}.restartPolicy", "must be Never or OnFailure (a Job's pods end)")
            )
    return problems


def _empty_stage(where: str, stage: api.Stage) -> Problem:
    """A stage that selects no cluster of the inventory: a typo would otherwise complete the
    rollout having upgraded nothing (issue 19), so the run is Invalid and names the stage."""
    what = (
        f"its selector {json.dumps(stage.selector.dump(), sort_keys=True)}"
        if stage.selector is not None
        else "its cluster list"
    )
    return Problem(
        where,
        f"stage {stage.name!r} selects no cluster of the plugin's inventory; check {what} "
        "against the clusters' labels and ids (a misspelt label value selects nothing), or "
        "remove the stage",
    )


def _floor_problem(required: int, total: int) -> Problem:
    return Problem(
        "spec.requiredAvailableCount",
        f"{required} leaves no cluster allowed out of service among {total}; "
        + (
            f"set it to at most {total - 1}"
            if total > 1
            else "the floor is at least 1, so a rollout needs at least 2 clusters: add a "
            "cluster to it (the floor keeps one in service while the other upgrades), or "
            "upgrade a lone cluster with its provider's own tools"
        ),
    )


def _concurrency_problems(field: str, value: int | str | None) -> list[Problem]:
    if value is None:
        return []
    try:
        api.parse_max_concurrency(value, 100)
    except ValueError as err:
        return [Problem(field, str(err))]
    return []


def _failures_problems(field: str, value: int | str | None) -> list[Problem]:
    if value is None:
        return []
    try:
        api.parse_max_failures(value, 100)
    except ValueError as err:
        return [Problem(field, str(err))]
    return []


def _people_problems(skip: api.SkipSpec | None, retry: api.RetrySpec | None) -> list[Problem]:
    """A cluster cannot be skipped and retried at once (level-triggered skip would win)."""
    both = sorted(
        set((skip.clusters if skip else None) or ()) & set(retry.clusters if retry else ())
    )
    if not both:
        return []
    return [
        Problem(
            "spec.retry.clusters",
            f"{', '.join(both[:5])} also in spec.skip.clusters; remove each from one of "
            "spec.skip.clusters and spec.retry.clusters",
        )
    ]


def _version_problems(where: str, cluster: api.ClusterSpec) -> list[Problem]:
    problems = []
    node = cluster.node_version or cluster.version
    if versions.is_newer(node, cluster.version):
        problems.append(
            Problem(
                f"{where}.nodeVersion",
                f"{node} is newer than the control plane target "
                f"{cluster.version}; node pools may not run ahead of the control plane",
            )
        )
    for j, pool in enumerate(cluster.node_pools or []):
        if versions.is_newer(pool.version, cluster.version):
            problems.append(
                Problem(
                    f"{where}.nodePools[{j}].version",
                    f"{pool.version} is newer than the control plane target {cluster.version}",
                )
            )
    return problems


#: Each cluster spec.clusters lists, by id: its index there and its entry.
_Listed = Mapping[str, tuple[int, api.ClusterSpec]]


def resolve_targets(
    spec: api.ClusterVersionSpec, inventory: Mapping[str, ClusterObs]
) -> Targets | list[Problem]:
    """Decide which clusters are managed, their stage and target, or say what is wrong: the
    listed clusters are in the inventory, each cluster is in one stage, each target is no
    downgrade, and the floor leaves room to upgrade."""
    problems: list[Problem] = []
    listed = {c.id: (i, c) for i, c in enumerate(spec.clusters or [])}
    for cid, (i, _) in listed.items():
        if cid not in inventory:
            problems.append(
                Problem(
                    f"spec.clusters[{i}].id",
                    f"cluster {cid!r} is not in the "
                    "plugin's inventory; check the id or the opsEndpoint",
                )
            )
    names, members, stage_of = _stage_membership(spec, listed, inventory, problems)
    targets = _cluster_targets(spec, listed, inventory, names, stage_of, problems)
    if targets and spec.required_available_count >= len(targets):
        problems.append(_floor_problem(spec.required_available_count, len(targets)))
    if problems:
        return problems
    return Targets(targets, names, members)


def _stage_membership(
    spec: api.ClusterVersionSpec,
    listed: _Listed,
    inventory: Mapping[str, ClusterObs],
    problems: list[Problem],
) -> tuple[list[str], list[list[str]], dict[str, int]]:
    """The stage names, each stage's members and each cluster's stage index (no stages: one
    "default" stage of the listed clusters); what is wrong is added to problems."""
    stages = (spec.strategy.stages if spec.strategy else None) or []
    if not stages:
        return ["default"], [sorted(listed)], dict.fromkeys(listed, 0)
    names: list[str] = []
    members: list[list[str]] = []
    stage_of: dict[str, int] = {}
    sorted_ids = sorted(inventory)
    for s, stage in enumerate(stages):
        where = f"spec.strategy.stages[{s}]"
        chosen: list[str] = []
        for k, cid in enumerate(stage.clusters or []):
            if cid not in inventory:
                problems.append(
                    Problem(
                        f"{where}.clusters[{k}]",
                        f"cluster {cid!r} is not in the plugin's inventory; check the id",
                    )
                )
            chosen.append(cid)
        if stage.selector is not None:
            chosen += [c for c in sorted_ids if stage.selector.matches(inventory[c].labels)]
        if not chosen:
            problems.append(_empty_stage(where, stage))
        for cid in dict.fromkeys(chosen):
            if cid in stage_of and stage_of[cid] != s:
                problems.append(
                    Problem(
                        f"{where}",
                        f"cluster {cid!r} is also in stage "
                        f"{stages[stage_of[cid]].name!r}; stages must not overlap",
                    )
                )
                continue
            stage_of[cid] = s
        names.append(stage.name)
        members.append(sorted(c for c, st in stage_of.items() if st == s))
    for cid, (i, _) in listed.items():
        if cid not in stage_of:
            problems.append(
                Problem(
                    f"spec.clusters[{i}].id",
                    f"cluster {cid!r} is in no stage; add it to a stage or remove it",
                )
            )
    return names, members, stage_of


def _cluster_targets(
    spec: api.ClusterVersionSpec,
    listed: _Listed,
    inventory: Mapping[str, ClusterObs],
    names: Sequence[str],
    stage_of: Mapping[str, int],
    problems: list[Problem],
) -> dict[str, Target]:
    """Each staged cluster's target: its own entry in spec.clusters, else spec.version (clusters
    with the same targets share one Target); a downgrade or a missing version is a problem."""
    targets: dict[str, Target] = {}
    shared = (
        [Target(spec.version, spec.version, {}, s) for s in range(len(names))]
        if (spec.version)
        else []
    )
    alike: dict[tuple[str, str | None, tuple[tuple[str, str], ...], int], Target] = {}
    for cid, s in stage_of.items():
        entry = listed.get(cid)
        if entry is None:
            if spec.version is None:
                problems.append(
                    Problem(
                        "spec.version",
                        f"is required: stage {names[s]!r} selects "
                        f"cluster {cid!r} which spec.clusters does not list",
                    )
                )
                continue
            targets[cid] = shared[s]
        else:
            c = entry[1]
            key = (
                c.version,
                c.node_version,
                tuple((p.name, p.version) for p in c.node_pools or []),
                s,
            )
            if key not in alike:  # clusters with the same targets share one Target
                alike[key] = Target(c.version, c.node_version or c.version, dict(key[2]), s)
            targets[cid] = alike[key]
        obs = inventory.get(cid)
        target = targets[cid]
        if obs is not None and versions.is_downgrade(obs.control_plane_version, target.version):
            field = f"spec.clusters[{entry[0]}].version" if entry else "spec.version"
            problems.append(
                Problem(
                    field,
                    f"{target.version} is older than cluster {cid!r}'s "
                    f"control plane {obs.control_plane_version}; downgrades are "
                    "not supported",
                )
            )
    return targets


@dataclass
class SpecCache:
    """What is computed from a custom resource's spec, kept per (uid, generation): with the
    status subresource, the apiserver bumps metadata.generation on every change of the spec
    and on nothing else a controller writes, so a spec parsed (and digested) once per
    generation is the spec of every reconcile of that generation (at 5,000 clusters, parsing
    an UpdateRun's spec costs ~11 ms of CPU; at 20,000, ~42 ms). An object without uid or
    generation is computed afresh. Bounded: the least recently used go first."""

    size: int = 512
    _kept: OrderedDict[tuple[str, str, int], object] = field(default_factory=OrderedDict)

    def get(self, obj: Mapping[str, Any], what: str, compute: Callable[[], T]) -> T:
        """compute() of this object's spec, once per generation (what: which value)."""
        meta = obj.get("metadata") or {}
        uid, generation = meta.get("uid"), meta.get("generation")
        if not uid or not isinstance(generation, int):
            return compute()
        key = (what, str(uid), generation)
        if key in self._kept:
            self._kept.move_to_end(key)
            return cast(T, self._kept[key])
        value = compute()
        self._kept[key] = value
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return value

    def parse(self, model: type[M], obj: Mapping[str, Any]) -> M | list[Problem]:
        """`parse_model` of the object's spec, once per generation (a fresh list of problems
        each time: callers may extend it)."""
        parsed = self.get(
            obj, f"parse:{model.__name__}", lambda: parse_model(model, obj.get("spec"))
        )
        return list(parsed) if isinstance(parsed, list) else parsed
