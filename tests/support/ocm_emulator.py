"""OCM agent emulator for tests: plays OCM's missing controllers against a real hub kube-apiserver.

OCM's agents cannot run here (they need real member clusters), so this emulator plays their
part on the hub, speaking only the documented API of the objects (field names as in
open-cluster-management-io/api and stolostron/cluster-curator-controller):

- the klusterlet registration agent and the hub's registration controller: ManagedCluster
  status (conditions ManagedClusterJoined, HubAcceptedManagedCluster,
  ManagedClusterConditionAvailable; version.kubernetes; clusterClaims) and the hub's
  cluster.open-cluster-management.io/unavailable|unreachable taints;
- the cluster-curator controller and its curator job: spec.curatorJob, the
  "clustercurator-job" / "upgrade-cluster" / "monitor-upgrade" conditions with reasons
  Job_has_finished / Job_failed, the "Upgrade status - ...% complete" progress messages, and
  the new version once the upgrade "finishes" (after a configurable time, or a failure with a
  message);
- the work agent: ManifestWork conditions (Applied, Available with observedGeneration),
  status.resourceStatus.manifests[] with per-manifest conditions (Available with reason
  ResourceNotAvailable when the object is absent, StatusFeedbackSynced) and statusFeedback
  values computed by evaluating the feedback rules (WellKnownStatus or JSONPaths) on an
  emulated spoke object: Deployments the test declares, and upgrade objects (e.g. a
  system-upgrade-controller Plan) whose status moves from Complete=False to Complete=True and
  then sets the cluster's version;
- the placement controller's taint handling, as a selection helper (select_clusters): a
  cluster with a NoSelect taint that the Placement does not tolerate is not selected.

Nothing here is used by the plugin; it only writes what the real agents would write.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.support.kube import KubeCluster

__all__ = [
    "AVAILABLE",
    "OcmEmulator",
    "jsonpath",
    "select_clusters",
]

AVAILABLE = "ManagedClusterConditionAvailable"
MC = ("cluster.open-cluster-management.io", "v1", "managedclusters")
CURATOR = ("cluster.open-cluster-management.io", "v1beta1", "clustercurators")
WORK = ("work.open-cluster-management.io", "v1", "manifestworks")
PLACEMENT = ("cluster.open-cluster-management.io", "v1beta1", "placements")
TAINT_UNAVAILABLE = "cluster.open-cluster-management.io/unavailable"
TAINT_UNREACHABLE = "cluster.open-cluster-management.io/unreachable"
_WELL_KNOWN_DEPLOYMENT = (
    ("ReadyReplicas", ".status.readyReplicas"),
    ("Replicas", ".status.replicas"),
    ("AvailableReplicas", ".status.availableReplicas"),
)


def _without_empty_strings(value: Any) -> Any:
    """The value with every "" map entry dropped.

    The kube-apiserver built here (Debian's 1.20 sources) rejects "" in CRD string fields as
    null (422); the real agents write "" in places (e.g. a condition's message). Dropping those
    entries keeps the meaning (absent and empty read the same to the plugin).
    """
    if isinstance(value, Mapping):
        return {k: _without_empty_strings(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [_without_empty_strings(v) for v in value]
    return value


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(conditions: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """apimachinery SetStatusCondition: lastTransitionTime moves only when status flips."""
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") == new["type"]:
            found = True
            merged = {**cond, **new}
            if cond.get("status") != new.get("status") or "lastTransitionTime" not in cond:
                merged["lastTransitionTime"] = _now()
            else:
                merged["lastTransitionTime"] = cond["lastTransitionTime"]
            out.append(merged)
        else:
            out.append(cond)
    if not found:
        out.append({**new, "lastTransitionTime": _now()})
    return out


# -- a small JSONPath (the subset feedback rules use) ------------------------------------------

_TOKEN = re.compile(
    r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*["']([^"']*)["']\)\]"""
)


def jsonpath(obj: Any, path: str) -> Any:
    """Evaluates .a.b, [N] and [?(@.k=="v")] steps; None when nothing matches."""
    pos = 0
    current: Any = obj
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if match is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {path[pos:]!r}")
        pos = match.end()
        key, index, fkey, fval = match.groups()
        if key is not None:
            current = current.get(key) if isinstance(current, Mapping) else None
        elif index is not None:
            current = (
                current[int(index)]
                if isinstance(current, list) and int(index) < len(current)
                else None
            )
        else:
            chosen = None
            for item in current if isinstance(current, list) else []:
                probe: Any = item
                for part in fkey.split("."):
                    probe = probe.get(part) if isinstance(probe, Mapping) else None
                if probe is not None and str(probe) == fval:
                    chosen = item
                    break
            current = chosen
        if current is None:
            return None
    return current


def _field_value(value: Any) -> dict[str, Any] | None:
    if isinstance(value, bool):
        return {"type": "Boolean", "boolean": value}
    if isinstance(value, int):
        return {"type": "Integer", "integer": value}
    if isinstance(value, str):
        return {"type": "String", "string": value}
    return None


# -- placement ----------------------------------------------------------------------------------


def _match_expressions(values: Mapping[str, str], expressions: list[dict[str, Any]]) -> bool:
    for expr in expressions or []:
        key, op, wanted = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and values.get(key) not in wanted:
            return False
        if op == "NotIn" and values.get(key) in wanted:
            return False
        if op == "Exists" and key not in values:
            return False
        if op == "DoesNotExist" and key in values:
            return False
    return True


def _tolerated(taint: Mapping[str, Any], tolerations: list[dict[str, Any]], now: datetime) -> bool:
    for tol in tolerations or []:
        operator = tol.get("operator") or "Equal"
        key = tol.get("key") or ""
        if key and key != taint.get("key"):
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Equal" and (tol.get("value") or "") != (taint.get("value") or ""):
            continue
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        seconds = tol.get("tolerationSeconds")
        added = taint.get("timeAdded")
        if seconds is not None and added:
            since = datetime.fromisoformat(str(added).replace("Z", "+00:00"))
            if since + timedelta(seconds=int(seconds)) < now:
                continue
        return True
    return False


def select_clusters(
    placement: Mapping[str, Any], clusters: list[Mapping[str, Any]], now: datetime | None = None
) -> list[str]:
    """The names a Placement selects, as the placement controller filters (sorted by name).

    Predicates (ORed; each a labelSelector AND claimSelector) filter the clusters; a taint with
    effect NoSelect or NoSelectIfNew (this helper makes fresh decisions) that no toleration
    matches excludes the cluster; PreferNoSelect does not. numberOfClusters keeps the first N
    by name (upstream picks by score). ManagedClusterSets are not emulated: every cluster is
    taken as bound to the Placement's namespace.
    """
    now = now or datetime.now(UTC)
    spec = placement.get("spec") or {}
    selected = []
    for mc in clusters:
        meta = mc.get("metadata") or {}
        labels = meta.get("labels") or {}
        claims = {
            c["name"]: c.get("value", "")
            for c in (mc.get("status") or {}).get("clusterClaims") or []
            if isinstance(c, Mapping) and "name" in c
        }
        predicates = spec.get("predicates") or [{}]
        matched = False
        for pred in predicates:
            sel = (pred or {}).get("requiredClusterSelector") or {}
            label_sel = sel.get("labelSelector") or {}
            claim_sel = sel.get("claimSelector") or {}
            if all(
                labels.get(k) == v for k, v in (label_sel.get("matchLabels") or {}).items()
            ) and (
                _match_expressions(labels, label_sel.get("matchExpressions") or [])
                and _match_expressions(claims, claim_sel.get("matchExpressions") or [])
            ):
                matched = True
                break
        if not matched:
            continue
        repelled = any(
            t.get("effect") in ("NoSelect", "NoSelectIfNew")
            and not _tolerated(t, spec.get("tolerations") or [], now)
            for t in (mc.get("spec") or {}).get("taints") or []
        )
        if not repelled:
            selected.append(str(meta.get("name")))
    selected.sort()
    limit = spec.get("numberOfClusters")
    return selected[:limit] if isinstance(limit, int) else selected


# -- the emulated member clusters ---------------------------------------------------------------


@dataclass
class _Deployment:
    replicas: int
    available: int


@dataclass
class _Member:
    """What the emulator knows about one member cluster's side."""

    version: str
    agent_up: bool = True
    deployments: dict[tuple[str, str], _Deployment] = field(default_factory=dict)
    curation_failure: tuple[str, str] | None = None  # (step, message) for the next curation
    plan_failure: tuple[str, str] | None = None  # (reason, message) for the next upgrade object


@dataclass
class _Curation:
    job: str
    target: str
    started: float
    failure: tuple[str, str] | None


@dataclass
class _Applied:
    """An upgrade object (e.g. a Plan) the work agent applied on the member."""

    digest: str
    target: str
    started: float
    failure: tuple[str, str] | None
    done: bool = False


class OcmEmulator:
    """Plays the OCM agents and the cluster curator on a hub (see the module docstring).

    A background thread polls the hub every `tick` seconds. Curations and upgrade objects take
    `upgrade_seconds`; the new version appears on the ManagedCluster `version_lag` seconds
    after the curator (or upgrade object) reports the end, as the registration agent's
    periodic status sync would.
    """

    def __init__(
        self,
        hub: KubeCluster,
        *,
        upgrade_seconds: float = 0.6,
        version_lag: float = 0.1,
        tick: float = 0.05,
        version_of_upgrade: Callable[[Mapping[str, Any]], str] | None = None,
    ) -> None:
        self.hub = hub
        self.upgrade_seconds = upgrade_seconds
        self.version_lag = version_lag
        self.tick = tick
        self._version_of_upgrade = version_of_upgrade or _spec_version
        self._api = hub.api_client()
        self._custom = k8s.CustomObjectsApi(self._api)
        self._core = k8s.CoreV1Api(self._api)
        self._members: dict[str, _Member] = {}
        self._curations: dict[str, _Curation] = {}
        self._applied: dict[tuple[str, str], _Applied] = {}
        self._pending_versions: dict[str, tuple[float, str]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.curations_started: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> OcmEmulator:
        self._thread = threading.Thread(target=self._loop, name="ocm-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._api.close()

    def __enter__(self) -> OcmEmulator:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- member clusters ---------------------------------------------------------------------

    def add_cluster(
        self,
        name: str,
        version: str,
        labels: Mapping[str, str] | None = None,
        claims: Mapping[str, str] | None = None,
    ) -> None:
        """Registers a cluster as a joined, accepted and available ManagedCluster."""
        with contextlib.suppress(ApiException):
            self._core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        body = {
            "apiVersion": "cluster.open-cluster-management.io/v1",
            "kind": "ManagedCluster",
            "metadata": {
                "name": name,
                "labels": {"name": name, **dict(labels or {})},
            },
            "spec": {"hubAcceptsClient": True, "leaseDurationSeconds": 60},
        }
        self._custom.create_cluster_custom_object(*MC, body)
        with self._lock:
            self._members[name] = _Member(version=version)
        status = {
            "conditions": [
                {
                    "type": "HubAcceptedManagedCluster",
                    "status": "True",
                    "reason": "HubClusterAdminAccepted",
                    "message": "Accepted by hub cluster admin",
                    "lastTransitionTime": _now(),
                },
                {
                    "type": "ManagedClusterJoined",
                    "status": "True",
                    "reason": "ManagedClusterJoined",
                    "message": "Managed cluster joined",
                    "lastTransitionTime": _now(),
                },
                {
                    "type": AVAILABLE,
                    "status": "True",
                    "reason": "ManagedClusterAvailable",
                    "message": "Managed cluster is available",
                    "lastTransitionTime": _now(),
                },
            ],
            "version": {"kubernetes": f"v{version}"},
            "clusterClaims": [
                {"name": "id.k8s.io", "value": f"{name}-id"},
                {"name": "kubeversion.open-cluster-management.io", "value": f"v{version}"},
                *({"name": k, "value": v} for k, v in (claims or {}).items()),
            ],
        }
        self._patch_mc_status(name, status)

    def cluster_names(self) -> list[str]:
        """The clusters this emulator registered (and has not removed)."""
        with self._lock:
            return sorted(self._members)

    def remove_cluster(self, name: str) -> None:
        """Deletes the ManagedCluster and its namespace (with everything in it)."""
        with self._lock:
            self._members.pop(name, None)
        with contextlib.suppress(ApiException):
            self._custom.delete_cluster_custom_object(*MC, name)
        # KubeCluster.delete_namespace covers each group's preferred version only, and
        # ClusterCurator is v1beta1 in a group whose preferred version is v1: delete them here.
        with contextlib.suppress(ApiException):
            self._custom.delete_collection_namespaced_custom_object(
                CURATOR[0], CURATOR[1], name, CURATOR[2]
            )
        self.hub.delete_namespace(name)

    def set_available(self, name: str, status: str, reason: str = "", message: str = "") -> None:
        """Sets ManagedClusterConditionAvailable, and the hub's taint as the hub would.

        status "True" brings the agent back; "False" (unavailable) or "Unknown" (lease expired:
        unreachable) stop the emulated agents of that cluster from reporting.
        """
        with self._lock:
            self._members[name].agent_up = status == "True"
        mc = self._custom.get_cluster_custom_object(*MC, name)
        conds = _set_condition(
            (mc.get("status") or {}).get("conditions") or [],
            {
                "type": AVAILABLE,
                "status": status,
                "reason": reason or "Emulated",
                "message": message or f"availability set to {status} by the emulator",
            },
        )
        self._patch_mc_status(name, {"conditions": conds})
        wanted = {"False": TAINT_UNAVAILABLE, "Unknown": TAINT_UNREACHABLE}.get(status)
        self._update_taints(
            name,
            lambda taints: (
                [t for t in taints if t.get("key") not in (TAINT_UNAVAILABLE, TAINT_UNREACHABLE)]
                + ([{"key": wanted, "effect": "NoSelect", "timeAdded": _now()}] if wanted else [])
            ),
        )

    def add_foreign_taint(self, name: str, taint: Mapping[str, Any]) -> None:
        """Adds a taint as another tool would (read-modify-write, retrying on 409)."""
        self._update_taints(name, lambda taints: [*taints, {"timeAdded": _now(), **dict(taint)}])

    def fail_next_curation(self, cluster: str, message: str, step: str = "monitor-upgrade") -> None:
        """The next curation of the cluster fails in step with message (curator job semantics)."""
        with self._lock:
            self._members[cluster].curation_failure = (step, message)

    def fail_next_upgrade_object(self, cluster: str, reason: str, message: str) -> None:
        """The next delivered upgrade object ends Complete=False with reason and message."""
        with self._lock:
            self._members[cluster].plan_failure = (reason, message)

    def set_deployment(
        self, cluster: str, namespace: str, name: str, available: int, replicas: int
    ) -> None:
        """Declares a Deployment on the member cluster (what the work agent would read)."""
        with self._lock:
            self._members[cluster].deployments[(namespace, name)] = _Deployment(replicas, available)

    def remove_deployment(self, cluster: str, namespace: str, name: str) -> None:
        with self._lock:
            self._members[cluster].deployments.pop((namespace, name), None)

    def managed_cluster(self, name: str) -> dict[str, Any]:
        return dict(self._custom.get_cluster_custom_object(*MC, name))

    def version_of(self, name: str) -> str:
        """status.version.kubernetes of the ManagedCluster, without the leading v."""
        mc = self.managed_cluster(name)
        return str((mc.get("status") or {}).get("version", {}).get("kubernetes", "")).lstrip("v")

    def taints_of(self, name: str) -> list[dict[str, Any]]:
        return list((self.managed_cluster(name).get("spec") or {}).get("taints") or [])

    def placement_decisions(self, namespace: str, name: str) -> list[str]:
        """The clusters a Placement on the hub selects now (placement controller emulation).

        Also records status.numberOfSelectedClusters, as the placement controller does.
        """
        placement = self._custom.get_namespaced_custom_object(
            PLACEMENT[0], PLACEMENT[1], namespace, PLACEMENT[2], name
        )
        clusters = self._custom.list_cluster_custom_object(*MC)["items"]
        chosen = select_clusters(placement, clusters)
        with contextlib.suppress(ApiException):
            self._custom.patch_namespaced_custom_object_status(
                PLACEMENT[0],
                PLACEMENT[1],
                namespace,
                PLACEMENT[2],
                name,
                {"status": {"numberOfSelectedClusters": len(chosen)}},
            )
        return chosen

    # -- hub writes --------------------------------------------------------------------------

    def _patch_mc_status(self, name: str, status: dict[str, Any]) -> None:
        body = {"status": _without_empty_strings(status)}
        self._custom.patch_cluster_custom_object_status(*MC, name, body)

    def _update_taints(
        self, name: str, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> None:
        for _ in range(20):
            mc = self._custom.get_cluster_custom_object(*MC, name)
            taints = list((mc.get("spec") or {}).get("taints") or [])
            body = {
                "metadata": {"resourceVersion": mc["metadata"]["resourceVersion"]},
                "spec": {"taints": change(taints)},
            }
            try:
                self._custom.patch_cluster_custom_object(*MC, name, body)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise RuntimeError(f"ManagedCluster {name} kept changing")

    def _set_version(self, name: str, version: str) -> None:
        """The registration agent's status sync: the hub learns the member's version."""
        with self._lock:
            if name not in self._members:
                return
        mc = self._custom.get_cluster_custom_object(*MC, name)
        claims = [
            {**c, "value": f"v{version}"}
            if c.get("name") == "kubeversion.open-cluster-management.io"
            else c
            for c in (mc.get("status") or {}).get("clusterClaims") or []
        ]
        self._patch_mc_status(
            name, {"version": {"kubernetes": f"v{version}"}, "clusterClaims": claims}
        )

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                self._step()
            except Exception as exc:  # keep playing; tests read .errors when they care
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if len(self.errors) > 100:
                    del self.errors[:50]

    def _step(self) -> None:
        now = time.monotonic()
        for cluster, (when, version) in list(self._pending_versions.items()):
            if now >= when:
                del self._pending_versions[cluster]
                self._set_version(cluster, version)
        for curator in self._custom.list_cluster_custom_object(*CURATOR)["items"]:
            with self._conflicts_retried():
                self._curate(curator, now)
        for work in self._custom.list_cluster_custom_object(*WORK)["items"]:
            with self._conflicts_retried():
                self._work_agent(work, now)

    @contextlib.contextmanager
    def _conflicts_retried(self) -> Iterator[None]:
        """409 (someone wrote meanwhile) and 404 (deleted) are retried next tick; others logged."""
        try:
            yield
        except ApiException as exc:
            if exc.status not in (404, 409):
                self.errors.append(f"{exc.status}: {exc.body}")

    # -- the cluster curator (controller + curator job) ----------------------------------------

    def _curate(self, curator: dict[str, Any], now: float) -> None:
        meta = curator["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        cluster = meta["namespace"]
        with self._lock:
            member = self._members.get(cluster)
        if member is None or not member.agent_up:
            return
        spec = curator.get("spec") or {}
        job = spec.get("curatorJob") or ""
        running = self._curations.get(key)
        if spec.get("desiredCuration") == "upgrade" and not job:
            desired = (spec.get("upgrade") or {}).get("desiredUpdate") or ""
            if not _need_to_upgrade(curator, member.version):
                return
            job = f"curator-job-{secrets.token_hex(3)}"
            with self._lock:
                failure, member.curation_failure = member.curation_failure, None
            curator["spec"]["curatorJob"] = job
            conds = (curator.get("status") or {}).get("conditions") or []
            conds = _set_condition(
                conds,
                {
                    "type": "clustercurator-job",
                    "status": "False",
                    "reason": "Job_has_finished",
                    "message": f"{job} DesiredCuration: upgrade",
                },
            )
            conds = _set_condition(
                conds,
                {
                    "type": "upgrade-cluster",
                    "status": "False",
                    "reason": "Job_has_finished",
                    "message": "Executing init container upgrade-cluster",
                },
            )
            curator["status"] = {"conditions": conds}
            self._replace_curator(curator)
            self._curations[key] = _Curation(job, desired, now, failure)
            self.curations_started[cluster] = self.curations_started.get(cluster, 0) + 1
            return
        if running is None or running.job != job:
            return
        fraction = (now - running.started) / max(self.upgrade_seconds, 1e-6)
        conds = (curator.get("status") or {}).get("conditions") or []
        info = (
            f"{running.target};{(spec.get('upgrade') or {}).get('channel', '')};"
            f"{(spec.get('upgrade') or {}).get('upstream', '')}"
        )
        if fraction >= 0.3:
            conds = _set_condition(
                conds,
                {
                    "type": "upgrade-cluster",
                    "status": "True",
                    "reason": "Job_has_finished",
                    "message": "Completed executing init container",
                },
            )
            percent = min(99, int(fraction * 100))
            conds = _set_condition(
                conds,
                {
                    "type": "monitor-upgrade",
                    "status": "False",
                    "reason": "Job_has_finished",
                    "message": f"Upgrade status - Working towards {running.target}: "
                    f"{percent}% complete",
                },
            )
        if running.failure is not None and fraction >= 0.5:
            step, message = running.failure
            conds = _set_condition(
                conds, {"type": step, "status": "True", "reason": "Job_failed", "message": message}
            )
            conds = _set_condition(
                conds,
                {
                    "type": "clustercurator-job",
                    "status": "True",
                    "reason": "Job_failed",
                    "message": f"{job} DesiredCuration: upgrade Version ({info}) "
                    f"Failed - {message}",
                },
            )
            curator["spec"].pop("curatorJob", None)
            curator["status"] = {"conditions": conds}
            self._replace_curator(curator)
            del self._curations[key]
            return
        if fraction >= 1.0:
            # The job's end: curatorJob and the step conditions cleared, then the job condition.
            curator["spec"].pop("curatorJob", None)
            curator["status"] = {
                "conditions": [
                    {
                        "type": "clustercurator-job",
                        "status": "True",
                        "reason": "Job_has_finished",
                        "message": f"{job} DesiredCuration: upgrade Version ({info})",
                        "lastTransitionTime": _now(),
                    }
                ]
            }
            with self._lock:
                member.version = running.target  # the member runs it; the hub learns it later
            self._pending_versions[cluster] = (now + self.version_lag, running.target)
            self._replace_curator(curator)
            del self._curations[key]
            return
        if conds != (curator.get("status") or {}).get("conditions"):
            curator["status"] = {"conditions": conds}
            self._replace_curator(curator)

    def _replace_curator(self, curator: dict[str, Any]) -> None:
        meta = curator["metadata"]
        self._custom.replace_namespaced_custom_object(
            CURATOR[0],
            CURATOR[1],
            meta["namespace"],
            CURATOR[2],
            meta["name"],
            _without_empty_strings(curator),
        )

    # -- the work agent ------------------------------------------------------------------------

    def _work_agent(self, work: dict[str, Any], now: float) -> None:
        meta = work["metadata"]
        cluster = meta["namespace"]
        with self._lock:
            member = self._members.get(cluster)
            if member is None or not member.agent_up:
                return  # an agent that is down reports nothing: what the hub has goes stale
        spec = work.get("spec") or {}
        manifests = (spec.get("workload") or {}).get("manifests") or []
        configs = spec.get("manifestConfigs") or []
        generation = int(meta.get("generation") or 1)
        statuses = []
        for ordinal, manifest in enumerate(manifests):
            ident, config = _config_for(manifest, configs)
            obj, applied_msg = self._spoke_object(cluster, meta["name"], manifest, config, now)
            values = _feedback(obj, manifest, config) if obj is not None else []
            conds = [
                {
                    "type": "Applied",
                    "status": "True",
                    "reason": "AppliedManifestComplete",
                    "message": applied_msg,
                    "observedGeneration": generation,
                },
                {
                    "type": "Available",
                    "status": "True" if obj is not None else "False",
                    "reason": "ResourceAvailable" if obj is not None else "ResourceNotAvailable",
                    "message": "Resource is available"
                    if obj is not None
                    else "Resource is not available",
                    "observedGeneration": generation,
                },
                {
                    "type": "StatusFeedbackSynced",
                    "status": "True",
                    "reason": "StatusFeedbackSynced" if values else "NoStatusFeedbackSynced",
                    "message": "",
                    "observedGeneration": generation,
                },
            ]
            api_version = str(manifest.get("apiVersion", ""))
            statuses.append(
                {
                    "resourceMeta": {
                        "ordinal": ordinal,
                        "group": api_version.rsplit("/", 1)[0] if "/" in api_version else "",
                        "version": api_version.rsplit("/", 1)[-1],
                        "kind": manifest.get("kind", ""),
                        "resource": ident.get("resource", ""),
                        "name": (manifest.get("metadata") or {}).get("name", ""),
                        "namespace": (manifest.get("metadata") or {}).get("namespace", ""),
                    },
                    "statusFeedback": {"values": values} if values else {},
                    "conditions": conds,
                }
            )
        old_status = work.get("status") or {}
        all_there = all(s["conditions"][1]["status"] == "True" for s in statuses)
        conds = old_status.get("conditions") or []
        conds = _set_condition(
            conds,
            {
                "type": "Applied",
                "status": "True",
                "reason": "AppliedManifestWorkComplete",
                "message": "Apply manifest work complete",
                "observedGeneration": generation,
            },
        )
        conds = _set_condition(
            conds,
            {
                "type": "Available",
                "status": "True" if all_there else "False",
                "reason": "ResourcesAvailable" if all_there else "ResourcesNotAvailable",
                "message": "All resources are available"
                if all_there
                else "One or more resources are not available",
                "observedGeneration": generation,
            },
        )
        new_status = {
            "conditions": conds,
            "resourceStatus": {"manifests": _stamped(statuses, old_status)},
        }
        if _strip_times(_without_empty_strings(new_status)) != _strip_times(old_status):
            work["status"] = _without_empty_strings(new_status)
            self._custom.replace_namespaced_custom_object_status(
                WORK[0], WORK[1], cluster, WORK[2], meta["name"], work
            )

    def _spoke_object(
        self,
        cluster: str,
        work_name: str,
        manifest: dict[str, Any],
        config: Mapping[str, Any],
        now: float,
    ) -> tuple[dict[str, Any] | None, str]:
        """The object as it is on the member cluster (None when absent) and the apply message."""
        kind = manifest.get("kind")
        meta = manifest.get("metadata") or {}
        read_only = (config.get("updateStrategy") or {}).get("type") == "ReadOnly"
        with self._lock:
            member = self._members[cluster]
            if kind == "Deployment" and read_only:
                found = member.deployments.get((meta.get("namespace", ""), meta.get("name", "")))
                if found is None:
                    return None, "Resource is read only"
                status: dict[str, Any] = {"replicas": found.replicas}
                if found.available:  # the Deployment omits zero counts
                    status["availableReplicas"] = found.available
                    status["readyReplicas"] = found.available
                return {**manifest, "status": status}, "Resource is read only"
        # An upgrade object the work agent applied: its controller works for upgrade_seconds.
        key = (cluster, f"{work_name}/{kind}/{meta.get('namespace', '')}/{meta.get('name', '')}")
        digest = json.dumps(manifest, sort_keys=True)
        applied = self._applied.get(key)
        if applied is None or applied.digest != digest:
            with self._lock:
                failure, member.plan_failure = member.plan_failure, None
            applied = _Applied(digest, self._version_of_upgrade(manifest), now, failure)
            self._applied[key] = applied
        fraction = (now - applied.started) / max(self.upgrade_seconds, 1e-6)
        obj = copy.deepcopy(manifest)
        if applied.failure is not None and fraction >= 0.5:
            reason, message = applied.failure
            complete = {"type": "Complete", "status": "False", "reason": reason, "message": message}
        elif fraction >= 1.0:
            complete = {"type": "Complete", "status": "True", "reason": "Complete", "message": ""}
            if not applied.done:
                applied.done = True
                member.version = applied.target
                self._pending_versions[cluster] = (now + self.version_lag, applied.target)
        else:
            complete = {
                "type": "Complete",
                "status": "False",
                "reason": "Applying",
                "message": f"applying {applied.target}: {min(99, int(fraction * 100))}%",
            }
        obj["status"] = {
            "conditions": [
                {"type": "LatestResolved", "status": "True", "reason": "Version"},
                complete,
            ],
            "latestVersion": (manifest.get("spec") or {}).get("version", ""),
            "applying": [] if complete["status"] == "True" else [f"{cluster}-node-0"],
        }
        return obj, "Apply manifest complete"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("-", 1)[0])[:3])


def _need_to_upgrade(curator: Mapping[str, Any], member_version: str) -> bool:
    """The curator controller's NeedToUpgrade, as it reads the last "clustercurator-job".

    No job condition: upgrade when desiredUpdate differs from what the cluster runs. A job
    still running (False): no. The last job failed for these same desiredUpdate;channel;upstream:
    no (a failed upgrade is not retried until the spec or the status changes). The last job
    upgraded to an older version or another channel/upstream: yes.
    """
    upgrade = (curator.get("spec") or {}).get("upgrade") or {}
    desired = str(upgrade.get("desiredUpdate") or "")
    channel, upstream = str(upgrade.get("channel") or ""), str(upgrade.get("upstream") or "")
    job = next(
        (
            c
            for c in (curator.get("status") or {}).get("conditions") or []
            if c.get("type") == "clustercurator-job"
        ),
        None,
    )
    if job is None:
        return bool(desired) and desired != member_version
    if job.get("status") == "False":
        return False
    message = str(job.get("message") or "")
    if "upgrade" not in message:
        return True
    if "Failed" in message:
        return f"{desired};{channel};{upstream}" not in message
    found = re.search(r"Version \(([^;)]*);([^;)]*);([^;)]*)", message)
    if found is None:
        return True
    done, done_channel, done_upstream = found.groups()
    return (
        _version_tuple(desired) > _version_tuple(done)
        or (bool(channel) and channel != done_channel)
        or (bool(upstream) and upstream != done_upstream)
    )


def _spec_version(manifest: Mapping[str, Any]) -> str:
    """The version an upgrade object installs: spec.version without a leading v or +suffix."""
    text = str((manifest.get("spec") or {}).get("version", ""))
    return text.lstrip("v").split("+", 1)[0]


def _config_for(
    manifest: Mapping[str, Any], configs: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = manifest.get("metadata") or {}
    for config in configs:
        ident = config.get("resourceIdentifier") or {}
        if ident.get("name") == meta.get("name") and (ident.get("namespace") or "") == (
            meta.get("namespace") or ""
        ):
            return ident, config
    return {"resource": str(manifest.get("kind", "")).lower() + "s"}, {}


def _feedback(
    obj: Mapping[str, Any], manifest: Mapping[str, Any], config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    values = []
    for rule in config.get("feedbackRules") or []:
        if rule.get("type") == "WellKnownStatus":
            paths = _WELL_KNOWN_DEPLOYMENT if manifest.get("kind") == "Deployment" else ()
        else:
            paths = tuple((p["name"], p["path"]) for p in rule.get("jsonPaths") or [])
        for name, path in paths:
            value = _field_value(jsonpath(obj, path))
            if value is not None:
                values.append({"name": name, "fieldValue": value})
    return values


def _stamped(statuses: list[dict[str, Any]], old_status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-manifest conditions with lastTransitionTime kept where the status did not flip."""
    old = {
        json.dumps(m.get("resourceMeta"), sort_keys=True): m
        for m in (old_status.get("resourceStatus") or {}).get("manifests") or []
    }
    out = []
    for entry in statuses:
        before = old.get(json.dumps(entry["resourceMeta"], sort_keys=True), {})
        conds: list[dict[str, Any]] = list(before.get("conditions") or [])
        for cond in entry["conditions"]:
            conds = _set_condition(conds, cond)
        out.append({**entry, "conditions": conds})
    return out


def _strip_times(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_times(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [_strip_times(v) for v in value]
    return value


@contextlib.contextmanager
def running_emulator(hub: KubeCluster, **options: Any) -> Iterator[OcmEmulator]:
    """An emulator started for the block, stopped afterwards."""
    emulator = OcmEmulator(hub, **options).start()
    try:
        yield emulator
    finally:
        emulator.stop()
