"""KubeFleet emulator for tests: plays KubeFleet's hub and member agents against real apiservers.

KubeFleet's agents cannot run here, so this emulator does their part, speaking only the
documented API (field names as in kubefleet-dev/kubefleet apis/placement/v1beta1 and
apis/cluster/v1beta1, behaviour as in pkg/controllers/updaterun):

- member join (the hub agent's MemberCluster controller and the member agent's heartbeat):
  the MemberCluster with its labels, status conditions ReadyToJoin / Joined / Healthy, the
  MemberAgent agentStatus (Joined, Healthy, lastReceivedHeartbeat), the property
  k8s.io/k8s-version, and the hub namespace fleet-member-<cluster>; each member's agent
  heartbeats again every spec.heartbeatPeriodSeconds (60) until go_silent(): then, as on a
  real hub, nothing changes its conditions, only lastReceivedHeartbeat grows old;
- the update-run controller, for ClusterStagedUpdateRun and StagedUpdateRun: with spec.state
  Initialize or Run it initializes status (policySnapshotIndexUsed, the strategy snapshot,
  stagesStatus with each stage's clusters chosen by the stage's labelSelector from the
  placement's clusters, sorted by sortingLabelKey then name, and the before/after task
  statuses with approvalRequestName <run>-before-<stage> / <run>-after-<stage>); with Run it
  executes stage by stage: a before-stage Approval, the clusters (maxConcurrency at a time,
  Started then Succeeded after update_seconds), then the after-stage tasks (TimedWait;
  Approval: it creates the ClusterApprovalRequest / ApprovalRequest with KubeFleet's labels,
  waits for Approved=True with observedGeneration = generation, then sets ApprovalAccepted and
  the task's ApprovalRequestApproved), and marks the stage and finally the run Succeeded. Stop
  pauses. Deleting a run deletes its approval requests (KubeFleet's finalizer does that);
- the placement path for ClusterResourcePlacements (scheduler, work generator with overrides,
  member work applier): PickFixed places on exactly spec.policy.clusterNames, PickAll on every
  joined member whose NoSchedule taints the placement tolerates; each selected cluster-scoped
  object is copied to the member after the ClusterResourceOverrides that select it (rules whose
  clusterSelector matches the member's labels; JSON patch add/remove/replace with
  ${MEMBER-CLUSTER-NAME} and ${MEMBER-CLUSTER-LABEL-KEY-<key>} replaced; an override with
  spec.placement applies to that placement only); objects no longer placed are deleted from the
  member; placement status gets per-cluster conditions;
- the admission rules of KubeFleet's validating webhooks that decide whether our writes would be
  accepted, checked where the emulator reads the objects (pkg/webhook/clusterresourceoverride
  and pkg/utils/validator/clusterresourceoverride.go: at most 100 ClusterResourceOverrides per
  hub, resources selected by name only (no labelSelector), each resource selected by at most one
  override, spec.placement immutable; pkg/webhook/clusterresourceplacement: PickFixed with at
  most 100 clusterNames): an override or placement that breaks one is ignored, as if refused,
  and the breach is recorded in `violations` (tests assert it stays empty);
- the update-run controller ignores an Approved condition whose observedGeneration is not the
  request's generation (pkg/controllers/updaterun/execution.go checks
  condition.IsConditionStatusTrue(cond, generation)).

Not emulated: resource snapshots and bindings (the "update" of a cluster is only its status),
ResourcePlacement propagation of namespaced objects (ResourcePlacements only choose a
StagedUpdateRun's clusters), scheduling beyond PickAll/PickFixed. Nothing here is used by the
plugin; it only writes what KubeFleet would write.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.support.kube import KubeCluster

__all__ = ["KubeFleetEmulator", "apply_json_patch", "override_for"]

PLACEMENT = ("placement.kubernetes-fleet.io", "v1beta1")
CLUSTER = ("cluster.kubernetes-fleet.io", "v1beta1")
RES = {
    "ClusterStagedUpdateRun": (*PLACEMENT, "clusterstagedupdateruns", False),
    "StagedUpdateRun": (*PLACEMENT, "stagedupdateruns", True),
    "ClusterStagedUpdateStrategy": (*PLACEMENT, "clusterstagedupdatestrategies", False),
    "StagedUpdateStrategy": (*PLACEMENT, "stagedupdatestrategies", True),
    "ClusterApprovalRequest": (*PLACEMENT, "clusterapprovalrequests", False),
    "ApprovalRequest": (*PLACEMENT, "approvalrequests", True),
    "ClusterResourcePlacement": (*PLACEMENT, "clusterresourceplacements", False),
    "ResourcePlacement": (*PLACEMENT, "resourceplacements", True),
    "ClusterResourceOverride": (*PLACEMENT, "clusterresourceoverrides", False),
    "MemberCluster": (*CLUSTER, "memberclusters", False),
}
#: Kinds of cluster-scoped objects the emulated placements can copy to members.
PLACEABLE = {"MetricCollector": ("metric.kubernetes-fleet.io", "v1alpha1", "metriccollectors")}

LABEL_RUN = "kubernetes-fleet.io/targetUpdateRun"
LABEL_STAGE = "kubernetes-fleet.io/targetUpdatingStage"
LABEL_LATEST = "kubernetes-fleet.io/isLatestUpdateRunApproval"
LABEL_TASK = "kubernetes-fleet.io/taskType"
PLACED_BY = "emulator.kubernetes-fleet.io/placed-by"
VERSION_PROPERTY = "k8s.io/k8s-version"


def _now(seconds_ago: float = 0.0) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind), None)


def _is_true(conditions: list[dict[str, Any]] | None, kind: str, gen: int | None = None) -> bool:
    cond = _cond(conditions, kind)
    if cond is None or cond.get("status") != "True":
        return False
    return gen is None or int(cond.get("observedGeneration") or 0) == gen


def _set(
    conditions: list[dict[str, Any]],
    kind: str,
    status: str,
    reason: str,
    gen: int,
    message: str = "",
) -> bool:
    """apimachinery SetStatusCondition; True when something changed.

    An empty message is written as the reason: the test apiserver (1.20) turns "" inside a
    merge-patched list into null, which the condition schema rejects.
    """
    message = message or reason
    current = _cond(conditions, kind)
    new = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": gen,
        "lastTransitionTime": _now(),
    }
    if current is None:
        conditions.append(new)
        return True
    if (current["status"], current["reason"], current.get("message", "")) == (
        status,
        reason,
        message,
    ) and current.get("observedGeneration") == gen:
        return False
    if current["status"] == status:
        new["lastTransitionTime"] = current["lastTransitionTime"]
    current.clear()
    current.update(new)
    return True


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics (None selects nothing is handled by the caller)."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req["key"], req["operator"], req.get("values") or []
        present = key in labels
        if op == "In" and (not present or labels[key] not in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply_json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add / remove / replace on a copy of obj (replace and remove need the path)."""
    out = copy.deepcopy(obj)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, op.get("value"))
            elif kind == "remove":
                del parent[index]
            else:
                parent[index] = op.get("value")
            continue
        if kind in ("replace", "remove") and last not in parent:
            raise KeyError(f"path {op['path']} does not exist")
        if kind == "remove":
            del parent[last]
        else:
            parent[last] = op.get("value")
    return out


def _substitute(value: Any, member: str, labels: Mapping[str, str]) -> Any:
    text = json.dumps(value).replace("${MEMBER-CLUSTER-NAME}", member)

    def label(match: re.Match[str]) -> str:
        return labels.get(match.group(1), "")

    text = re.sub(r"\$\{MEMBER-CLUSTER-LABEL-KEY-([^}]+)\}", label, text)
    return json.loads(text)


def override_for(
    obj: dict[str, Any],
    kind: str,
    overrides: list[dict[str, Any]],
    member: str,
    labels: Mapping[str, str],
) -> dict[str, Any] | None:
    """obj as member gets it after the ClusterResourceOverrides (None: a Delete rule applies)."""
    name = obj["metadata"]["name"]
    out = obj
    for cro in sorted(overrides, key=lambda o: o["metadata"]["name"]):
        spec = cro.get("spec") or {}
        if not any(
            s.get("kind") == kind and s.get("name") == name
            for s in spec.get("clusterResourceSelectors") or []
        ):
            continue
        for rule in (spec.get("policy") or {}).get("overrideRules") or []:
            selector = rule.get("clusterSelector")
            if selector is None:
                continue  # a nil clusterSelector selects no cluster
            terms = selector.get("clusterSelectorTerms") or []
            if terms and not any(_matches(t.get("labelSelector"), labels) for t in terms):
                continue
            if rule.get("overrideType", "JSONPatch") == "Delete":
                return None
            ops = [
                {**op, "value": _substitute(op.get("value"), member, labels)}
                for op in rule.get("jsonPatchOverrides") or []
            ]
            out = apply_json_patch(out, ops)
    return out


@dataclass
class _Member:
    name: str
    cluster: KubeCluster | None
    api: k8s.CustomObjectsApi | None


class KubeFleetEmulator:
    """KubeFleet's hub and member agents, emulated (see the module docstring)."""

    def __init__(
        self,
        hub: KubeCluster,
        members: Mapping[str, KubeCluster] | None = None,
        *,
        update_seconds: float = 0.3,
        poll_seconds: float = 0.3,
    ) -> None:
        self.hub = hub
        self._api_client = hub.api_client()
        self.api = k8s.CustomObjectsApi(self._api_client)
        self.core = k8s.CoreV1Api(self._api_client)
        self.update_seconds = update_seconds
        self.poll_seconds = poll_seconds
        self._members: dict[str, _Member] = {}
        for name, cluster in (members or {}).items():
            api = k8s.CustomObjectsApi(cluster.api_client())
            self._members[name] = _Member(name, cluster, api)
        self._started: dict[tuple[str, str], float] = {}
        self._placed: dict[tuple[str, str, str], str] = {}  # (member, kind, name) -> CRP
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.violations: list[str] = []
        self._override_placements: dict[str, str | None] = {}
        self._beats: dict[str, tuple[float, str]] = {}  # member -> (monotonic time, version)
        self._silent: set[str] = set()
        self.on_cluster_updated: Callable[[str, str], None] | None = None

    # -- generic access ------------------------------------------------------------------------

    def _res(self, kind: str) -> tuple[str, str, str, bool]:
        return RES[kind]

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        group, version, plural, namespaced = self._res(kind)
        try:
            if namespaced:
                return dict(
                    self.api.get_namespaced_custom_object(group, version, namespace, plural, name)
                )
            return dict(self.api.get_cluster_custom_object(group, version, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str) -> list[dict[str, Any]]:
        group, version, plural, _ = self._res(kind)
        return list(self.api.list_cluster_custom_object(group, version, plural)["items"])

    def create(self, kind: str, body: dict[str, Any], namespace: str = "") -> dict[str, Any]:
        group, version, plural, namespaced = self._res(kind)
        body = {"apiVersion": f"{group}/{version}", "kind": kind, **body}
        if namespaced:
            return dict(
                self.api.create_namespaced_custom_object(group, version, namespace, plural, body)
            )
        return dict(self.api.create_cluster_custom_object(group, version, plural, body))

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        group, version, plural, namespaced = self._res(kind)
        with contextlib.suppress(ApiException):
            if namespaced:
                self.api.delete_namespaced_custom_object(group, version, namespace, plural, name)
            else:
                self.api.delete_cluster_custom_object(group, version, plural, name)

    def patch(self, kind: str, name: str, body: dict[str, Any], namespace: str = "") -> None:
        group, version, plural, namespaced = self._res(kind)
        if namespaced:
            self.api.patch_namespaced_custom_object(group, version, namespace, plural, name, body)
        else:
            self.api.patch_cluster_custom_object(group, version, plural, name, body)

    def _status(self, kind: str, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        """Conditional status write (resourceVersion); False on a conflict."""
        group, version, plural, namespaced = self._res(kind)
        meta = obj["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        try:
            if namespaced:
                self.api.patch_namespaced_custom_object_status(
                    group, version, meta["namespace"], plural, meta["name"], body
                )
            else:
                self.api.patch_cluster_custom_object_status(
                    group, version, plural, meta["name"], body
                )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    # -- members ---------------------------------------------------------------------------------

    def join(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        version: str = "1.29.4",
        cluster: KubeCluster | None = None,
    ) -> None:
        """Registers a member as KubeFleet's join would leave it (idempotent)."""
        if cluster is not None:
            self._members[name] = _Member(name, cluster, k8s.CustomObjectsApi(cluster.api_client()))
        else:
            self._members.setdefault(name, _Member(name, None, None))
        with contextlib.suppress(ApiException):
            self.core.create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=f"fleet-member-{name}"))
            )
        body = {
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {
                "identity": {
                    "kind": "ServiceAccount",
                    "name": "fleet-member-agent-sa",
                    "namespace": "fleet-system",
                },
                "heartbeatPeriodSeconds": 60,
            },
        }
        try:
            obj = self.create("MemberCluster", body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            existing = self.get("MemberCluster", name)
            assert existing is not None
            self.patch("MemberCluster", name, {"metadata": {"labels": dict(labels or {})}})
            obj = existing
        self.heartbeat(name, version, obj)

    def heartbeat(
        self,
        name: str,
        version: str,
        obj: dict[str, Any] | None = None,
        *,
        seconds_ago: float = 0.0,
    ) -> None:
        """The member agent's status report: joined, healthy, version property, and its
        heartbeat time (seconds_ago in the past; the agent speaks again: not silent)."""
        obj = obj or self.get("MemberCluster", name)
        assert obj is not None
        gen = int(obj["metadata"].get("generation") or 1)
        self._silent.discard(name)
        self._beats[name] = (time.monotonic(), version)
        now = _now()
        beat = _now(seconds_ago)
        conds: list[dict[str, Any]] = []
        for kind, reason in (
            ("ReadyToJoin", "MemberClusterReadyToJoin"),
            ("Joined", "MemberClusterJoined"),
            ("Healthy", "MemberClusterHealthy"),
        ):
            _set(conds, kind, "True", reason, gen)
        agent: list[dict[str, Any]] = []
        _set(agent, "Joined", "True", "MemberAgentJoined", gen)
        _set(agent, "Healthy", "True", "MemberAgentHealthy", gen)
        status = {
            "conditions": conds,
            "agentStatus": [
                {"type": "MemberAgent", "conditions": agent, "lastReceivedHeartbeat": beat}
            ],
            "properties": {VERSION_PROPERTY: {"value": f"v{version}", "observationTime": now}},
        }
        for _ in range(5):
            if self._status("MemberCluster", obj, status):
                return
            obj = self.get("MemberCluster", name)
            assert obj is not None
        raise RuntimeError(f"cannot write the status of MemberCluster {name}")

    def go_silent(self, name: str, seconds_ago: float = 0.0) -> None:
        """The member agent stops reporting (crashed, partitioned, its cluster gone), its last
        heartbeat seconds_ago in the past. KubeFleet's hub changes nothing on the
        MemberCluster then (conditions stay True); heartbeat() brings the agent back."""
        obj = self.get("MemberCluster", name)
        assert obj is not None
        self.heartbeat(
            name, self._beats.get(name, (0.0, "1.29.4"))[1], obj, seconds_ago=seconds_ago
        )
        self._silent.add(name)

    def _heartbeats(self, members: Mapping[str, dict[str, Any]]) -> None:
        """Every member agent not silent reports again once its heartbeat period has passed."""
        for name, obj in members.items():
            beat = self._beats.get(name)
            if name in self._silent or beat is None:
                continue
            period = float((obj.get("spec") or {}).get("heartbeatPeriodSeconds") or 60)
            if time.monotonic() - beat[0] >= period:
                self.heartbeat(name, beat[1], obj)

    def leave(self, name: str) -> None:
        """Deletes the MemberCluster (KubeFleet keeps the namespace until cleanup; so do we)."""
        self.delete("MemberCluster", name)
        self._members.pop(name, None)

    def members(self) -> dict[str, dict[str, Any]]:
        return {m["metadata"]["name"]: m for m in self.list("MemberCluster")}

    # -- the loop --------------------------------------------------------------------------------

    def start(self) -> KubeFleetEmulator:
        self._thread = threading.Thread(target=self._run, name="kubefleet-emulator", daemon=True)
        self._thread.start()
        return self

    def stop_loop(self) -> None:
        """Stops the emulated controllers (the clients stay usable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def stop(self) -> None:
        self.stop_loop()
        self._api_client.close()

    def clear(self) -> None:
        """Deletes every run, strategy, placement, override, tracker and MetricCollector on the
        hub, then runs the controllers once so approval requests and member copies go too."""
        for kind in (
            "ClusterStagedUpdateRun",
            "StagedUpdateRun",
            "ClusterStagedUpdateStrategy",
            "StagedUpdateStrategy",
            "ClusterResourcePlacement",
            "ResourcePlacement",
            "ClusterResourceOverride",
        ):
            for obj in self.list(kind):
                self.delete(kind, obj["metadata"]["name"], obj["metadata"].get("namespace", ""))
        for group in ("metric.kubernetes-fleet.io", "autoapprove.kubernetes-fleet.io"):
            version = "v1alpha1"
            cluster_scoped = ["clusterstagedworkloadtrackers"]
            if group.startswith("metric."):
                cluster_scoped.append("metriccollectors")
            for plural in cluster_scoped:
                for obj in self.api.list_cluster_custom_object(group, version, plural)["items"]:
                    with contextlib.suppress(ApiException):
                        self.api.delete_cluster_custom_object(
                            group, version, plural, obj["metadata"]["name"]
                        )
            for plural in ("stagedworkloadtrackers", "metriccollectorreports"):
                for obj in self.api.list_cluster_custom_object(group, version, plural)["items"]:
                    meta = obj["metadata"]
                    with contextlib.suppress(ApiException):
                        self.api.delete_namespaced_custom_object(
                            group, version, meta["namespace"], plural, meta["name"]
                        )
        self.violations.clear()
        self.tick()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep emulating; tests read .errors when in doubt
                self.errors.append(f"{type(exc).__name__}: {exc}")
                del self.errors[:-20]
            self._stop.wait(self.poll_seconds)

    def tick(self) -> None:
        """One pass of every emulated controller."""
        members = self.members()
        self._heartbeats(members)
        for kind in ("ClusterStagedUpdateRun", "StagedUpdateRun"):
            for run in self.list(kind):
                self._step_run(kind, run, members)
        self._collect_approval_requests()
        self._place(members)

    # -- update runs -----------------------------------------------------------------------------

    def _placement_clusters(
        self, run_kind: str, run: dict[str, Any], members: Mapping[str, dict[str, Any]]
    ) -> list[str] | None:
        namespace = run["metadata"].get("namespace", "")
        kind = "ResourcePlacement" if run_kind == "StagedUpdateRun" else "ClusterResourcePlacement"
        placement = self.get(kind, run["spec"]["placementName"], namespace)
        if placement is None:
            return None
        return _scheduled(placement, members)

    def _step_run(self, kind: str, run: dict[str, Any], members: Mapping[str, Any]) -> None:
        spec = run["spec"]
        status = copy.deepcopy(run.get("status") or {})
        gen = int(run["metadata"].get("generation") or 1)
        conds = status.setdefault("conditions", [])
        changed = False
        if _cond(conds, "Initialized") is None:
            changed = self._initialize(kind, run, status, members, gen)
        elif (
            spec.get("state") == "Run"
            and _is_true(conds, "Initialized")
            and not _is_true(conds, "Succeeded")
        ):
            changed = self._execute(kind, run, status, gen)
        elif spec.get("state") == "Stop":
            changed = _set(conds, "Progressing", "False", "UpdateRunStopped", gen)
        if changed:
            self._status(kind, run, status)

    def _initialize(
        self,
        kind: str,
        run: dict[str, Any],
        status: dict[str, Any],
        members: Mapping[str, dict[str, Any]],
        gen: int,
    ) -> bool:
        namespace = run["metadata"].get("namespace", "")
        strategy_kind = (
            "StagedUpdateStrategy" if kind == "StagedUpdateRun" else "ClusterStagedUpdateStrategy"
        )
        strategy = self.get(strategy_kind, run["spec"]["stagedRolloutStrategyName"], namespace)
        clusters = self._placement_clusters(kind, run, members)
        conds = status["conditions"]
        if strategy is None or clusters is None:
            what = "strategy" if strategy is None else "placement"
            return _set(
                conds,
                "Initialized",
                "False",
                "UpdateRunInitializedFailed",
                gen,
                f"the {what} is not found",
            )
        stages_status = []
        placed: set[str] = set()
        for stage in strategy["spec"]["stages"]:
            selector = stage.get("labelSelector")
            chosen = [
                c
                for c in clusters
                if selector is not None and _matches(selector, _labels(members[c]))
            ]
            key = stage.get("sortingLabelKey")

            def order(name: str, key: str | None = key) -> tuple[int, str]:
                raw = _labels(members[name]).get(key or "", "")
                return (int(raw) if raw.lstrip("-").isdigit() else 0, name)

            chosen.sort(key=order)
            placed.update(chosen)
            run_name = run["metadata"]["name"]
            stages_status.append(
                {
                    "stageName": stage["name"],
                    "clusters": [{"clusterName": c} for c in chosen],
                    "beforeStageTaskStatus": [
                        {"type": t["type"]}
                        | (
                            {"approvalRequestName": f"{run_name}-before-{stage['name']}"}
                            if t["type"] == "Approval"
                            else {}
                        )
                        for t in stage.get("beforeStageTasks") or []
                    ],
                    "afterStageTaskStatus": [
                        {"type": t["type"]}
                        | (
                            {"approvalRequestName": f"{run_name}-after-{stage['name']}"}
                            if t["type"] == "Approval"
                            else {}
                        )
                        for t in stage.get("afterStageTasks") or []
                    ],
                }
            )
        if placed != set(clusters):
            return _set(
                conds,
                "Initialized",
                "False",
                "UpdateRunInitializedFailed",
                gen,
                "some clusters are not placed in any stage",
            )
        status.update(
            policySnapshotIndexUsed="0",
            policyObservedClusterCount=len(clusters),
            resourceSnapshotIndexUsed=run["spec"].get("resourceSnapshotIndex") or "0",
            stagedUpdateStrategySnapshot=copy.deepcopy(strategy["spec"]),
            stagesStatus=stages_status,
        )
        _set(conds, "Initialized", "True", "UpdateRunInitializedSuccessfully", gen)
        return True

    def _execute(self, kind: str, run: dict[str, Any], status: dict[str, Any], gen: int) -> bool:
        conds = status["conditions"]
        changed = _set(conds, "Progressing", "True", "UpdateRunProgressing", gen)
        snapshot = status["stagedUpdateStrategySnapshot"]["stages"]
        for index, stage in enumerate(status["stagesStatus"]):
            sconds = stage.setdefault("conditions", [])
            if _is_true(sconds, "Succeeded"):
                continue
            changed |= self._execute_stage(kind, run, stage, snapshot[index], gen)
            return changed
        changed |= _set(conds, "Progressing", "False", "UpdateRunSucceeded", gen)
        changed |= _set(conds, "Succeeded", "True", "UpdateRunSucceeded", gen)
        return changed

    def _approval(
        self, kind: str, run: dict[str, Any], stage: str, task: dict[str, Any], task_type: str
    ) -> tuple[bool, bool]:
        """(changed, approved) for one Approval task, as handleStageApprovalTask does it."""
        tconds = task.setdefault("conditions", [])
        gen = int(run["metadata"].get("generation") or 1)
        if _is_true(tconds, "ApprovalRequestApproved", gen):
            return False, True
        request_kind = "ApprovalRequest" if kind == "StagedUpdateRun" else "ClusterApprovalRequest"
        namespace = run["metadata"].get("namespace", "")
        name = task["approvalRequestName"]
        request = self.get(request_kind, name, namespace)
        if request is None:
            body = {
                "metadata": {
                    "name": name,
                    "labels": {
                        LABEL_STAGE: stage,
                        LABEL_RUN: run["metadata"]["name"],
                        LABEL_TASK: task_type,
                        LABEL_LATEST: "true",
                    },
                },
                "spec": {"parentStageRollout": run["metadata"]["name"], "targetStage": stage},
            }
            if namespace:
                body["metadata"]["namespace"] = namespace
            self.create(request_kind, body, namespace)
            return _set(
                tconds, "ApprovalRequestCreated", "True", "StageTaskApprovalRequestCreated", gen
            ), False
        changed = _set(
            tconds, "ApprovalRequestCreated", "True", "StageTaskApprovalRequestCreated", gen
        )
        rgen = int(request["metadata"].get("generation") or 1)
        rconds = (request.get("status") or {}).get("conditions") or []
        approved = _is_true(rconds, "Approved", rgen)
        accepted = _is_true(rconds, "ApprovalAccepted", rgen)
        if not approved and not accepted:
            return changed, False
        if approved and not accepted:
            new = copy.deepcopy(rconds)
            _set(
                new,
                "ApprovalAccepted",
                "True",
                "ApprovalRequestApprovalAccepted",
                rgen,
                "The approval request has been approved and cannot be reverted",
            )
            if not self._status(request_kind, request, {"conditions": new}):
                return changed, False
        changed |= _set(
            tconds, "ApprovalRequestApproved", "True", "StageTaskApprovalRequestApproved", gen
        )
        return changed, True

    def _execute_stage(
        self,
        kind: str,
        run: dict[str, Any],
        stage: dict[str, Any],
        config: dict[str, Any],
        gen: int,
    ) -> bool:
        sconds = stage["conditions"]
        changed = False
        for task in stage.get("beforeStageTaskStatus") or []:
            if task["type"] != "Approval":
                continue
            moved, approved = self._approval(kind, run, stage["stageName"], task, "beforeStage")
            changed |= moved
            if not approved:
                return changed | _set(sconds, "Progressing", "False", "StageUpdatingWaiting", gen)
        if "startTime" not in stage:
            stage["startTime"] = _now()
            changed = True
        changed |= _set(sconds, "Progressing", "True", "StageUpdatingStarted", gen)
        clusters = stage["clusters"]
        total = len(clusters)
        limit = _max_concurrency(config.get("maxConcurrency", 1), total)
        key = run["metadata"].get("uid", run["metadata"]["name"])
        now = time.monotonic()
        busy = 0
        for cluster in clusters:
            cconds = cluster.setdefault("conditions", [])
            if _is_true(cconds, "Succeeded"):
                continue
            if _is_true(cconds, "Started"):
                started = self._started.setdefault((key, cluster["clusterName"]), now)
                if now - started >= self.update_seconds:
                    changed |= _set(cconds, "Succeeded", "True", "ClusterUpdatingSucceeded", gen)
                    if self.on_cluster_updated is not None:
                        self.on_cluster_updated(run["metadata"]["name"], cluster["clusterName"])
                else:
                    busy += 1
        for cluster in clusters:
            cconds = cluster["conditions"]
            if busy >= limit:
                break
            if not _cond(cconds, "Started"):
                changed |= _set(cconds, "Started", "True", "ClusterUpdatingStarted", gen)
                self._started[(key, cluster["clusterName"])] = now
                busy += 1
        if not all(_is_true(c["conditions"], "Succeeded") for c in clusters):
            return changed
        finished = True
        for task in stage.get("afterStageTaskStatus") or []:
            tconds = task.setdefault("conditions", [])
            if task["type"] == "TimedWait":
                wait = next(
                    (
                        t.get("waitTime")
                        for t in config.get("afterStageTasks") or []
                        if t["type"] == "TimedWait"
                    ),
                    "0s",
                )
                done_at = self._started.setdefault((key, f"wait/{stage['stageName']}"), now)
                if now - done_at >= _seconds(wait):
                    changed |= _set(
                        tconds, "WaitTimeElapsed", "True", "AfterStageTaskWaitTimeElapsed", gen
                    )
                else:
                    finished = False
            else:
                moved, approved = self._approval(kind, run, stage["stageName"], task, "afterStage")
                changed |= moved
                finished = finished and approved
        if not finished:
            return changed | _set(sconds, "Progressing", "False", "StageUpdatingWaiting", gen)
        stage["endTime"] = _now()
        _set(sconds, "Progressing", "False", "StageUpdatingSucceeded", gen)
        _set(sconds, "Succeeded", "True", "StageUpdatingSucceeded", gen)
        return True

    def _collect_approval_requests(self) -> None:
        """KubeFleet's run finalizer: a deleted run's approval requests are deleted."""
        runs = {("", r["metadata"]["name"]) for r in self.list("ClusterStagedUpdateRun")}
        runs |= {
            (r["metadata"]["namespace"], r["metadata"]["name"])
            for r in self.list("StagedUpdateRun")
        }
        for kind in ("ClusterApprovalRequest", "ApprovalRequest"):
            for request in self.list(kind):
                meta = request["metadata"]
                namespace = meta.get("namespace", "")
                run = (meta.get("labels") or {}).get(LABEL_RUN, "")
                if run and (namespace, run) not in runs:
                    self.delete(kind, meta["name"], namespace)

    # -- placements ------------------------------------------------------------------------------

    def _violation(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    def _admitted_overrides(self) -> list[dict[str, Any]]:
        """The ClusterResourceOverrides KubeFleet's webhook would have admitted (oldest first)."""
        admitted: list[dict[str, Any]] = []
        selected: dict[tuple[str, str], str] = {}
        overrides = sorted(
            self.list("ClusterResourceOverride"),
            key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"]["name"]),
        )
        for index, cro in enumerate(overrides):
            name = cro["metadata"]["name"]
            spec = cro.get("spec") or {}
            if index >= 100:
                self._violation(f"ClusterResourceOverride {name}: more than 100 on the hub")
                continue
            placement = (spec.get("placement") or {}).get("name")
            before = self._override_placements.setdefault(name, placement)
            if before != placement:
                self._violation(f"ClusterResourceOverride {name}: spec.placement changed")
                continue
            problems = []
            for sel in spec.get("clusterResourceSelectors") or []:
                key = (sel.get("kind", ""), sel.get("name", ""))
                if sel.get("labelSelector") is not None or not key[1]:
                    problems.append("a selector without a name (label selectors are refused)")
                elif key in selected and selected[key] != name:
                    problems.append(f"{key[0]} {key[1]} is selected by {selected[key]} already")
            if problems:
                self._violation(f"ClusterResourceOverride {name}: {'; '.join(problems)}")
                continue
            for sel in spec.get("clusterResourceSelectors") or []:
                selected[(sel.get("kind", ""), sel.get("name", ""))] = name
            admitted.append(cro)
        known = {o["metadata"]["name"] for o in overrides}
        for gone in set(self._override_placements) - known:
            del self._override_placements[gone]
        return admitted

    def _place(self, members: Mapping[str, dict[str, Any]]) -> None:
        overrides = self._admitted_overrides()
        wanted: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
        for crp in self.list("ClusterResourcePlacement"):
            policy = crp["spec"].get("policy") or {}
            if len(policy.get("clusterNames") or []) > 100:
                self._violation(f"ClusterResourcePlacement {crp['metadata']['name']}: >100 names")
                continue
            targets = _scheduled(crp, members)
            per_cluster: dict[str, str] = {}
            for selector in crp["spec"].get("resourceSelectors") or []:
                kind, name = selector.get("kind", ""), selector.get("name", "")
                if kind not in PLACEABLE or not name:
                    continue
                group, version, plural = PLACEABLE[kind]
                try:
                    obj = dict(self.api.get_cluster_custom_object(group, version, plural, name))
                except ApiException as exc:
                    if exc.status == 404:
                        continue
                    raise
                for member in targets:
                    try:
                        mine = [
                            o
                            for o in overrides
                            if (o["spec"].get("placement") or {}).get("name")
                            in (None, crp["metadata"]["name"])
                        ]
                        placed = override_for(obj, kind, mine, member, _labels(members[member]))
                    except (KeyError, ValueError, IndexError) as exc:
                        per_cluster[member] = f"override failed: {exc}"
                        continue
                    if placed is not None:
                        wanted[(member, kind, name)] = (crp["metadata"]["name"], placed)
                    per_cluster.setdefault(member, "")
            self._placement_status(crp, targets, per_cluster)
        for (member, kind, _name), (crp_name, obj) in wanted.items():
            self._apply(member, kind, obj, crp_name)
        for key in [k for k in self._placed if k not in wanted]:
            member, kind, name = key
            self._remove(member, kind, name)
            self._placed.pop(key, None)

    def _placement_status(
        self, crp: dict[str, Any], targets: list[str], problems: Mapping[str, str]
    ) -> None:
        gen = int(crp["metadata"].get("generation") or 1)
        old = crp.get("status") or {}
        conds = copy.deepcopy(old.get("conditions") or [])
        changed = _set(
            conds, "ClusterResourcePlacementScheduled", "True", "SchedulingPolicyFulfilled", gen
        )
        failed = sorted(c for c, p in problems.items() if p)
        changed |= _set(
            conds,
            "ClusterResourcePlacementApplied",
            "False" if failed else "True",
            "ApplyFailed" if failed else "ApplySucceeded",
            gen,
            "; ".join(f"{c}: {problems[c]}" for c in failed),
        )
        per = []
        for cluster in targets:
            pconds: list[dict[str, Any]] = []
            old_entry = next(
                (p for p in old.get("placementStatuses") or [] if p.get("clusterName") == cluster),
                None,
            )
            if old_entry:
                pconds = copy.deepcopy(old_entry.get("conditions") or [])
            bad = problems.get(cluster, "")
            _set(
                pconds,
                "Applied",
                "False" if bad else "True",
                "ApplyFailed" if bad else "AllWorkSynced",
                gen,
                bad,
            )
            per.append({"clusterName": cluster, "conditions": pconds})
        if changed or per != (old.get("placementStatuses") or []):
            self._status(
                "ClusterResourcePlacement", crp, {"conditions": conds, "placementStatuses": per}
            )

    def _apply(self, member: str, kind: str, obj: dict[str, Any], crp: str) -> None:
        target = self._members.get(member)
        if target is None or target.api is None:
            return
        group, version, plural = PLACEABLE[kind]
        meta = obj["metadata"]
        desired = {
            "apiVersion": f"{group}/{version}",
            "kind": kind,
            "metadata": {
                "name": meta["name"],
                "labels": dict(meta.get("labels") or {}),
                "annotations": {**(meta.get("annotations") or {}), PLACED_BY: crp},
            },
            "spec": obj.get("spec") or {},
        }
        try:
            current = dict(
                target.api.get_cluster_custom_object(group, version, plural, meta["name"])
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            target.api.create_cluster_custom_object(group, version, plural, desired)
            self._placed[(member, kind, meta["name"])] = crp
            return
        self._placed[(member, kind, meta["name"])] = crp
        same = current.get("spec") == desired["spec"] and all(
            (current["metadata"].get(k) or {}) == v
            for k, v in desired["metadata"].items()
            if k in ("labels", "annotations")
        )
        if not same:
            body = {"metadata": desired["metadata"], "spec": desired["spec"]}
            target.api.patch_cluster_custom_object(group, version, plural, meta["name"], body)

    def _remove(self, member: str, kind: str, name: str) -> None:
        target = self._members.get(member)
        if target is None or target.api is None:
            return
        group, version, plural = PLACEABLE[kind]
        with contextlib.suppress(ApiException):
            target.api.delete_cluster_custom_object(group, version, plural, name)


def _labels(member: Mapping[str, Any]) -> dict[str, str]:
    return dict((member.get("metadata") or {}).get("labels") or {})


def _joined(member: Mapping[str, Any]) -> bool:
    return _is_true((member.get("status") or {}).get("conditions"), "Joined")


def _tolerates(placement: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    for tol in ((placement.get("spec") or {}).get("policy") or {}).get("tolerations") or []:
        if tol.get("effect") not in (None, "", taint.get("effect")):
            continue
        if tol.get("operator") == "Exists" and tol.get("key") in (None, "", taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _scheduled(placement: Mapping[str, Any], members: Mapping[str, dict[str, Any]]) -> list[str]:
    """The scheduler's choice for PickFixed (exactly the names) and PickAll (joined, taints)."""
    policy = (placement.get("spec") or {}).get("policy") or {}
    kind = policy.get("placementType", "PickAll")
    if kind == "PickFixed":
        return sorted(c for c in policy.get("clusterNames") or [] if c in members)
    chosen = []
    for name, member in sorted(members.items()):
        if not _joined(member) or member["metadata"].get("deletionTimestamp"):
            continue
        taints = (member.get("spec") or {}).get("taints") or []
        if all(_tolerates(placement, t) for t in taints):
            chosen.append(name)
    return chosen


def _max_concurrency(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return max(1, total * int(value[:-1]) // 100)
    return max(1, int(value or 1))


def _seconds(text: str) -> float:
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)([smh])", text or ""))
