"""OCM agent emulator for tests: plays OCM's missing controllers against a real hub kube-apiserver.

OCM's agents cannot run here (they need real member clusters), so this emulator plays their
part on the hub, speaking only the documented API of the objects (field names as in
open-cluster-management-io/api and stolostron/cluster-curator-controller):

- the klusterlet registration agent and the hub's registration controller: ManagedCluster
  status (conditions ManagedClusterJoined, HubAcceptedManagedCluster,
  ManagedClusterConditionAvailable; version.kubernetes with the Kubernetes version and the
  version.openshift.io claim with the OpenShift version, see kubernetes_version) and the hub's
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
- the placement controller's taint handling (select_clusters): a cluster with a NoSelect taint
  that the Placement does not tolerate is not selected; each Placement's PlacementDecision
  follows what it selects `placement_lag` seconds after a change, as the real controller
  reschedules asynchronously.

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
from kubernetes import watch as k8s_watch
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
MCI = ("internal.open-cluster-management.io", "v1beta1", "managedclusterinfos")
CURATOR = ("cluster.open-cluster-management.io", "v1beta1", "clustercurators")
HOSTED_CLUSTER = ("hypershift.openshift.io", "v1beta1", "hostedclusters")
_HOSTED_CLUSTER_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "hostedclusters.hypershift.openshift.io"},
    "spec": {
        "group": "hypershift.openshift.io",
        "scope": "Namespaced",
        "names": {
            "plural": "hostedclusters",
            "singular": "hostedcluster",
            "kind": "HostedCluster",
            "listKind": "HostedClusterList",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
WORK = ("work.open-cluster-management.io", "v1", "manifestworks")
PLACEMENT = ("cluster.open-cluster-management.io", "v1beta1", "placements")
DECISION = ("cluster.open-cluster-management.io", "v1beta1", "placementdecisions")
TAINT_UNAVAILABLE = "cluster.open-cluster-management.io/unavailable"
TAINT_UNREACHABLE = "cluster.open-cluster-management.io/unreachable"
OFFERED = ("1.28.5", "1.29.1", "1.29.4", "1.30.0", "1.30.2", "1.31.0")
"""Versions the emulated clusters' update service offers (availableUpdates: the newer ones)."""

CHANNELS = ("stable", "fast", "candidate")
"""Channels the emulated clusters accept (ManagedClusterInfo ocp.desired.channels)."""

MANAGED_CLUSTER_INFO_CRD: dict[str, Any] = {
    # MINIMAL TEST SCHEMA: ../shared/upstream has no ManagedClusterInfo CRD (it belongs to
    # stolostron/multicloud-operators-foundation, deploy/foundation/hub/resources/crds/
    # internal.open-cluster-management.io_managedclusterinfos.yaml). Only what the curator
    # controller and job read is typed: status.kubeVendor and status.distributionInfo.ocp.
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "managedclusterinfos.internal.open-cluster-management.io"},
    "spec": {
        "group": "internal.open-cluster-management.io",
        "scope": "Namespaced",
        "names": {
            "kind": "ManagedClusterInfo",
            "listKind": "ManagedClusterInfoList",
            "plural": "managedclusterinfos",
            "singular": "managedclusterinfo",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "kubeVendor": {"type": "string"},
                                    "distributionInfo": {
                                        "type": "object",
                                        "properties": {
                                            "type": {"type": "string"},
                                            "ocp": {
                                                "type": "object",
                                                "x-kubernetes-preserve-unknown-fields": True,
                                                "properties": {
                                                    "version": {"type": "string"},
                                                    "availableUpdates": {
                                                        "type": "array",
                                                        "items": {"type": "string"},
                                                    },
                                                },
                                            },
                                        },
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}

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


KUBE_VERSION_CLAIM = "kubeversion.open-cluster-management.io"
OPENSHIFT_VERSION_CLAIM = "version.openshift.io"
_OPENSHIFT = re.compile(r"^4\.(\d+)\.(\d+)$")


def kubernetes_version(version: str) -> str:
    """What the registration agent reports in status.version.kubernetes (and the kubeversion
    claim) for a cluster running `version`: the apiserver's gitVersion. Every cluster here is
    OpenShift (its ManagedClusterInfo says so) and `version` is its OpenShift version, which
    the agent reports apart, in the version.openshift.io ClusterClaim (OCM's well-known claims:
    kubeversion.open-cluster-management.io everywhere, version.openshift.io on OpenShift).
    OpenShift 4.y ships Kubernetes 1.(y+13) with a +<commit> suffix, e.g. 4.14.10 reports
    v1.27.6+b49f9d1 (the patch here is illustrative). A version that is not 4.y.z (the tests'
    1.x stand-ins) is reported as v<version>, as a vanilla cluster's would be."""
    match = _OPENSHIFT.match(version)
    if match is None:
        return f"v{version}"
    minor, patch = int(match.group(1)), int(match.group(2))
    return f"v1.{minor + 13}.{patch % 10}+b49f9d1"


def _stale_taint_denial(exc: ApiException) -> bool:
    """The hub webhook's 400 for a taint whose timeAdded it does not accept."""
    return exc.status == 400 and "not allowed to set TimeAdded" in str(exc.body)


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
    recorded: bool = False  # the job's first conditions are written
    cluster: str = ""  # the cluster curated: the curator's namespace, or its name (hosted)
    hosted: bool = False  # the hosted path: the job patches the HostedCluster


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
        offered: tuple[str, ...] = OFFERED,
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
        self.curator_events_dropped: dict[str, int] = {}
        self.offered = tuple(offered)
        self._offered: dict[str, tuple[str, ...]] = {}
        self._queue: set[str] = set()
        self._steps = 0
        #: Seconds the placement controller takes to act on a change of what a Placement
        #: selects (it reschedules asynchronously); its decisions are rewritten after that.
        self.placement_lag = 0.5
        self._next_placement = 0.0
        self._selected: dict[tuple[str, str], tuple[list[str], float]] = {}
        self._decided: dict[tuple[str, str], list[str]] = {}
        self._watcher: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> OcmEmulator:
        self._thread = threading.Thread(target=self._loop, name="ocm-emulator", daemon=True)
        self._watcher = threading.Thread(
            target=self._watch_curators, name="ocm-emulator-curators", daemon=True
        )
        self._watcher.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._watcher):
            if thread is not None:
                thread.join(timeout=8)
        self._api.close()

    def __enter__(self) -> OcmEmulator:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- member clusters ---------------------------------------------------------------------

    def add_hosted_cluster(self, namespace: str, name: str) -> None:
        """A HyperShift HostedCluster on the hub (the hub then hosts that cluster's control
        plane). HyperShift's CRD is not among the pinned upstream files: a minimal one
        (group hypershift.openshift.io, v1beta1, namespaced, fields kept as written) stands
        for it; the plugin only lists HostedClusters by name and namespace."""
        self.hub.install_crds(_HOSTED_CLUSTER_CRD)
        with contextlib.suppress(ApiException):  # 409: there already
            self._core.create_namespace({"metadata": {"name": namespace}})
        self._custom.create_namespaced_custom_object(
            *HOSTED_CLUSTER[:2],
            namespace,
            HOSTED_CLUSTER[2],
            {
                "apiVersion": f"{HOSTED_CLUSTER[0]}/{HOSTED_CLUSTER[1]}",
                "kind": "HostedCluster",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"release": {"image": "quay.io/openshift-release-dev/ocp-release:4.14.10"}},
            },
        )

    def remove_hosted_cluster(self, namespace: str, name: str) -> None:
        """Deletes a HostedCluster (HyperShift destroyed that hosted control plane)."""
        self._custom.delete_namespaced_custom_object(
            *HOSTED_CLUSTER[:2], namespace, HOSTED_CLUSTER[2], name
        )

    def add_cluster(
        self,
        name: str,
        version: str,
        labels: Mapping[str, str] | None = None,
        claims: Mapping[str, str] | None = None,
        taints: list[Mapping[str, Any]] | None = None,
        cluster_claims: bool = True,
    ) -> None:
        """Registers a cluster as a joined, accepted and available ManagedCluster (created
        with `taints`, in that order: the hub's webhook stamps each one's timeAdded).

        cluster_claims=False: a registration agent with its ClusterClaim feature gate off
        exposes no claims on the ManagedCluster (open-cluster-management-io/ocm
        pkg/registration/spoke/managedcluster/claim_reconcile.go returns before exposeClaims),
        so no version.openshift.io claim there; the foundation agent still copies the claim it
        created on the member into the ManagedClusterInfo's distributionInfo.ocp.version
        (multicloud-operators-foundation pkg/klusterlet/clusterinfo/distributionInfo_sync.go)."""
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
        if taints:
            body["spec"]["taints"] = [dict(t) for t in taints]
        self._custom.create_cluster_custom_object(*MC, body)
        with self._lock:
            self._members[name] = _Member(version=version)
        status: dict[str, Any] = {
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
            "version": {"kubernetes": kubernetes_version(version)},
        }
        if cluster_claims:
            status["clusterClaims"] = [
                {"name": "id.k8s.io", "value": f"{name}-id"},
                {"name": KUBE_VERSION_CLAIM, "value": kubernetes_version(version)},
                {"name": OPENSHIFT_VERSION_CLAIM, "value": version},
                *({"name": k, "value": v} for k, v in (claims or {}).items()),
            ]
        self._patch_mc_status(name, status)
        self._write_cluster_info(name, version)

    def write_cluster_info(self, name: str, version: str) -> None:
        """Writes the cluster's ManagedClusterInfo as the foundation agent's sync would when
        the member ran `version` (a stale copy when it runs another: that sync is periodic)."""
        self._write_cluster_info(name, version)

    def cluster_info_version(self, name: str) -> str:
        """status.distributionInfo.ocp.version of the cluster's ManagedClusterInfo."""
        info = self._cluster_info(name) or {}
        ocp = ((info.get("status") or {}).get("distributionInfo") or {}).get("ocp") or {}
        return str(ocp.get("version", ""))

    def _write_cluster_info(self, name: str, version: str) -> None:
        """The ManagedClusterInfo the foundation agent reports (ACM): vendor, version and the
        updates the cluster's update service offers (the offered versions newer than it runs).
        distributionInfo.ocp.version is the member's version.openshift.io claim, copied
        (pkg/klusterlet/clusterinfo/distributionInfo_sync.go, claimLister.Get), whether or
        not the registration agent exposes claims on the ManagedCluster."""
        with self._lock:
            offered = self._offered.get(name, self.offered)
        current = _semver(version)
        newer = [v for v in offered if current is None or ((_semver(v) or current) > current)]
        status = {
            "kubeVendor": "OpenShift",
            "version": kubernetes_version(version),
            "distributionInfo": {
                "type": "OCP",
                "ocp": {
                    "version": version,
                    "availableUpdates": newer,
                    "desired": {"version": version, "channels": list(CHANNELS)},
                },
            },
        }
        body = {
            "apiVersion": f"{MCI[0]}/{MCI[1]}",
            "kind": "ManagedClusterInfo",
            "metadata": {"name": name, "namespace": name},
        }
        with contextlib.suppress(ApiException):
            self._custom.create_namespaced_custom_object(MCI[0], MCI[1], name, MCI[2], body)
        self._custom.patch_namespaced_custom_object_status(
            MCI[0], MCI[1], name, MCI[2], name, {"status": status}
        )

    def set_offered(self, name: str, versions: tuple[str, ...]) -> None:
        """The versions the cluster's update service offers from now on."""
        with self._lock:
            self._offered[name] = tuple(versions)
            version = self._members[name].version
        self._write_cluster_info(name, version)

    def remove_cluster_info(self, name: str) -> None:
        """Deletes the cluster's ManagedClusterInfo (a hub without ACM's foundation agent)."""
        self._custom.delete_namespaced_custom_object(MCI[0], MCI[1], name, MCI[2], name)

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
        # A hosted cluster's curator sits in its HostedCluster's namespace, named after it.
        with contextlib.suppress(ApiException):
            elsewhere = self._custom.list_cluster_custom_object(
                *CURATOR, field_selector=f"metadata.name={name}"
            )
            for item in elsewhere.get("items") or []:
                self._custom.delete_namespaced_custom_object(
                    *CURATOR[:2], item["metadata"]["namespace"], CURATOR[2], name
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
                # No timeAdded: the hub's mutating webhook sets it (and denies one sent).
                + ([{"key": wanted, "effect": "NoSelect"}] if wanted else [])
            ),
        )

    def add_foreign_taint(self, name: str, taint: Mapping[str, Any]) -> None:
        """Adds a taint as another tool would (read-modify-write, retrying on 409); the hub's
        webhook stamps its timeAdded."""
        self._update_taints(name, lambda taints: [*taints, dict(taint)])

    def fail_next_curation(self, cluster: str, message: str, step: str = "monitor-upgrade") -> None:
        """The next curation of the cluster fails in step with message (curator job semantics)."""
        with self._lock:
            self._members[cluster].curation_failure = (step, message)

    def reconcile_curator_now(self, cluster: str) -> None:
        """The curator controller's reconcile of <cluster>/<cluster>, run now: what a reconcile
        queued earlier (by an event its predicate passed) does if it runs at this moment."""
        self._reconcile_curator(f"{cluster}/{cluster}", time.monotonic())

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
        """The version the cluster runs, as the version.openshift.io claim reports it (the
        OpenShift version; what ClusterCurator's desiredUpdate names)."""
        mc = self.managed_cluster(name)
        claims = (mc.get("status") or {}).get("clusterClaims") or []
        return next(
            (str(c["value"]) for c in claims if c.get("name") == OPENSHIFT_VERSION_CLAIM), ""
        )

    def kubernetes_version_of(self, name: str) -> str:
        """status.version.kubernetes of the ManagedCluster, as reported (leading v kept)."""
        mc = self.managed_cluster(name)
        return str((mc.get("status") or {}).get("version", {}).get("kubernetes", ""))

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
                # The hub's webhook runs before the resourceVersion check: a write from a stale
                # read (a taint removed meanwhile, sent back with its timeAdded) is denied (400)
                # instead of conflicting (409). Both mean: read again.
                if exc.status != 409 and not _stale_taint_denial(exc):
                    raise
        raise RuntimeError(f"ManagedCluster {name} kept changing")

    def _set_version(self, name: str, version: str) -> None:
        """The registration agent's status sync: the hub learns the member's version."""
        with self._lock:
            if name not in self._members:
                return
        mc = self._custom.get_cluster_custom_object(*MC, name)
        values = {KUBE_VERSION_CLAIM: kubernetes_version(version), OPENSHIFT_VERSION_CLAIM: version}
        claims = [
            {**c, "value": values[c.get("name", "")]} if c.get("name") in values else c
            for c in (mc.get("status") or {}).get("clusterClaims") or []
        ]
        self._patch_mc_status(
            name, {"version": {"kubernetes": kubernetes_version(version)}, "clusterClaims": claims}
        )
        with contextlib.suppress(ApiException):
            self._write_cluster_info(name, version)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                self._step()
            except Exception as exc:  # keep playing; tests read .errors when they care
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if len(self.errors) > 100:
                    del self.errors[:50]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Returns once the curator queue is empty and two more ticks of the loop ran."""
        with self._lock:
            start = self._steps
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._steps >= start + 2 and not self._queue:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the emulator stayed busy for {timeout:.0f}s")
            self._stop.wait(self.tick)

    def _step(self) -> None:
        try:
            self._step_once()
        finally:
            with self._lock:
                self._steps += 1

    def _step_once(self) -> None:
        now = time.monotonic()
        for cluster, (when, version) in list(self._pending_versions.items()):
            if now >= when:
                del self._pending_versions[cluster]
                self._set_version(cluster, version)
        with self._lock:
            queued, self._queue = sorted(self._queue), set()
        for key in queued:
            with self._conflicts_retried(requeue=key):
                self._reconcile_curator(key, now)
        for key in list(self._curations):
            with self._conflicts_retried():
                self._run_job(key, now)
        for work in self._custom.list_cluster_custom_object(*WORK)["items"]:
            with self._conflicts_retried():
                self._work_agent(work, now)
        if now >= self._next_placement:
            self._next_placement = now + 0.2
            self._placement_controller(now)

    def _placement_controller(self, now: float) -> None:
        """The placement controller: each Placement's PlacementDecision
        (`<placement>-decision-1`, labelled cluster.open-cluster-management.io/placement) lists
        the clusters select_clusters picks; a change of that selection (a NoSelect taint
        added, a label) reaches the decision `placement_lag` seconds later, as the real
        controller reschedules asynchronously (open-cluster-management-io/ocm
        pkg/placement/controllers/scheduling)."""
        placements = self._custom.list_cluster_custom_object(*PLACEMENT)["items"]
        if not placements:
            return
        clusters = self._custom.list_cluster_custom_object(*MC)["items"]
        for placement in placements:
            meta = placement["metadata"]
            key = (meta["namespace"], meta["name"])
            want = select_clusters(placement, clusters)
            seen = self._selected.get(key)
            if seen is None or seen[0] != want:
                self._selected[key] = seen = (want, now)
            written = self._decided.get(key)
            if written == want or (written is not None and now - seen[1] < self.placement_lag):
                continue
            with self._conflicts_retried():
                self._write_decision(key[0], key[1], want)
                self._decided[key] = want

    def _write_decision(self, namespace: str, placement: str, clusters: list[str]) -> None:
        name = f"{placement}-decision-1"
        with contextlib.suppress(ApiException):  # 409: it exists
            self._custom.create_namespaced_custom_object(
                *DECISION[:2],
                namespace,
                DECISION[2],
                {
                    "apiVersion": f"{DECISION[0]}/{DECISION[1]}",
                    "kind": "PlacementDecision",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {"cluster.open-cluster-management.io/placement": placement},
                    },
                },
            )
        decisions = [{"clusterName": c, "reason": "selected"} for c in clusters]
        self._custom.patch_namespaced_custom_object_status(
            *DECISION[:2], namespace, DECISION[2], name, {"status": {"decisions": decisions}}
        )

    def decided(self, namespace: str, placement: str) -> list[str]:
        """The clusters the Placement's PlacementDecision lists now (as written)."""
        try:
            obj = self._custom.get_namespaced_custom_object(
                *DECISION[:2], namespace, DECISION[2], f"{placement}-decision-1"
            )
        except ApiException:
            return []
        return [d["clusterName"] for d in (obj.get("status") or {}).get("decisions") or []]

    @contextlib.contextmanager
    def _conflicts_retried(self, requeue: str = "") -> Iterator[None]:
        """409 (someone wrote meanwhile) and 404 (deleted) are retried next tick; others logged.

        requeue: a curator key the controller reconciles again (controller-runtime requeues a
        reconcile that returned an error).
        """
        try:
            yield
        except ApiException as exc:
            if exc.status not in (404, 409):
                self.errors.append(f"{exc.status}: {exc.body}")
            if requeue and exc.status != 404:
                self._enqueue(requeue)

    # -- the cluster curator: controller (watch + predicate + reconcile) and curator job -----------

    def _watch_curators(self) -> None:
        """The curator controller's informer: every update event goes through its predicate.

        A real watch (not the poll of the tick loop) so that two writes in quick succession are
        two events, as controller-runtime sees them. (Re)lists deliver create events, which
        the predicate lets through (controller-runtime's CreateFunc default).
        """
        api = self.hub.api_client()
        custom = k8s.CustomObjectsApi(api)
        seen: dict[str, dict[str, Any]] = {}
        try:
            while not self._stop.is_set():
                try:
                    listed = custom.list_cluster_custom_object(*CURATOR)
                    version = listed["metadata"]["resourceVersion"]
                    for item in listed["items"]:
                        key = _key(item)
                        if key not in seen:
                            self._enqueue(key)
                        seen[key] = item
                    watcher = k8s_watch.Watch()
                    for event in watcher.stream(
                        custom.list_cluster_custom_object,
                        *CURATOR,
                        resource_version=version,
                        timeout_seconds=5,
                    ):
                        if self._stop.is_set():
                            watcher.stop()
                            break
                        obj = event["object"]
                        key = _key(obj)
                        if event["type"] == "DELETED":
                            seen.pop(key, None)
                            continue
                        old = seen.get(key)
                        seen[key] = obj
                        if old is None or curator_update_passes(old, obj):
                            self._enqueue(key)
                        else:
                            with self._lock:
                                self.curator_events_dropped[key] = (
                                    self.curator_events_dropped.get(key, 0) + 1
                                )
                except ApiException as exc:
                    if exc.status != 410:
                        self.errors.append(f"curator watch: {exc.status}")
                    self._stop.wait(0.2)
                except Exception as exc:  # keep watching; a dropped stream re-lists
                    if not self._stop.is_set():
                        self.errors.append(f"curator watch: {type(exc).__name__}: {exc}")
                    self._stop.wait(0.2)
        finally:
            api.close()

    def _enqueue(self, key: str) -> None:
        with self._lock:
            self._queue.add(key)

    def _reconcile_curator(self, key: str, now: float) -> None:
        """controllers/clustercurator_controller.go Reconcile (the upgrade path), then the job."""
        namespace, name = key.split("/", 1)
        try:
            curator = self._custom.get_namespaced_custom_object(
                CURATOR[0], CURATOR[1], namespace, CURATOR[2], name
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        # isHostedCluster (controllers/clustercurator_controller.go): a HostedCluster named
        # like the curator in the curator's namespace takes the hosted path, whose job curates
        # the cluster of the curator's name (pkg/jobs/hypershift UpgradeCluster(clusterName =
        # curator.Name, namespace = curator.Namespace)); otherwise the standalone path curates
        # the cluster of the curator's namespace (the hive job's ClusterDeployment there).
        hosted = self._is_hosted_cluster(namespace, name)
        cluster = name if hosted else namespace
        with self._lock:
            member = self._members.get(cluster)
        if member is None:
            return
        spec = curator.get("spec") or {}
        posthook_only = bool((curator.get("operation") or {}).get("retryPosthook"))
        if (spec.get("curatorJob") or not spec.get("desiredCuration")) and not posthook_only:
            return  # "No curation to do"
        if spec.get("desiredCuration") != "upgrade":
            return  # install / destroy / scale curations are not emulated
        # NeedToUpgrade reads ManagedClusterInfo <curator.Name>/<curator.Name>.
        if not need_to_upgrade(curator, self._cluster_info(name)):
            return
        # launcher.CreateJob: a Job, then utils.RecordCuratorJobName (spec.curatorJob).
        job = f"curator-job-{secrets.token_hex(3)}"
        curator["spec"]["curatorJob"] = job
        self._replace_curator(curator)  # a 409 requeues the reconcile: nothing started yet
        with self._lock:
            failure, member.curation_failure = member.curation_failure, None
            self.curations_started[cluster] = self.curations_started.get(cluster, 0) + 1
        target = str((spec.get("upgrade") or {}).get("desiredUpdate") or "")
        self._curations[key] = _Curation(job, target, now, failure, cluster=cluster, hosted=hosted)

    def _is_hosted_cluster(self, namespace: str, name: str) -> bool:
        """isHostedCluster: a HostedCluster <namespace>/<name> exists (any error: not hosted)."""
        try:
            self._custom.get_namespaced_custom_object(
                *HOSTED_CLUSTER[:2], namespace, HOSTED_CLUSTER[2], name
            )
        except ApiException:
            return False
        return True

    def hosted_cluster(self, namespace: str, name: str) -> dict[str, Any]:
        """The HostedCluster as the hub holds it."""
        return dict(
            self._custom.get_namespaced_custom_object(
                *HOSTED_CLUSTER[:2], namespace, HOSTED_CLUSTER[2], name
            )
        )

    def _run_job(self, key: str, now: float) -> None:
        """The curator job (cmd/curator/curator.go, upgrade path) one step further."""
        running = self._curations[key]
        namespace, name = key.split("/", 1)
        with self._lock:
            member = self._members.get(running.cluster)
        if member is None:
            del self._curations[key]
            return
        if not member.agent_up:
            return  # the job's monitor step waits on the cluster
        try:
            curator = self._custom.get_namespaced_custom_object(
                CURATOR[0], CURATOR[1], namespace, CURATOR[2], name
            )
        except ApiException as exc:
            if exc.status == 404:
                del self._curations[key]
                return
            raise
        spec = curator.get("spec") or {}
        if spec.get("curatorJob") != running.job:
            del self._curations[key]  # someone else took the curator over
            return
        upgrade = spec.get("upgrade") or {}
        info = version_info(upgrade)
        job = running.job
        conds = (curator.get("status") or {}).get("conditions") or []
        if not running.recorded:
            # curatorRun: the job condition False, then the init container's own condition.
            conds = _set_condition(
                conds,
                _job_condition("False", "Job_has_finished", f"{job} DesiredCuration: upgrade"),
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
            running.recorded = True
            return
        if running.failure is None:
            # pkg/jobs/hive/hive.go validateUpgradeVersion: only an offered version upgrades.
            problem = _validate_upgrade(
                running.target, upgrade, self._cluster_info(running.cluster)
            )
            if problem:
                running.failure = ("upgrade-cluster", problem)
                running.started = now - self.upgrade_seconds  # fails at once
        fraction = (now - running.started) / max(self.upgrade_seconds, 1e-6)
        if running.failure is not None and fraction >= 0.5:
            step, message = running.failure
            conds = _set_condition(
                conds, {"type": step, "status": "True", "reason": "Job_failed", "message": message}
            )
            conds = _set_condition(
                conds,
                _job_condition(
                    "True",
                    "Job_failed",
                    f"{job} DesiredCuration: upgrade Version ({info}) Failed - {message}",
                ),
            )
            # updateFailingClusterCurator (upgrade): curatorJob and operation cleared,
            # desiredCuration kept, status kept.
            curator["spec"].pop("curatorJob", None)
            curator.pop("operation", None)
            curator["status"] = {"conditions": conds}
            self._replace_curator(curator)
            del self._curations[key]
            return
        if fraction >= 1.0:
            # updateDoneClusterCurator (upgrade): curatorJob, status and operation cleared,
            # desiredCuration kept; then the job condition recorded. Upstream makes these two
            # writes; they are one here (the end state is the same).
            curator["spec"].pop("curatorJob", None)
            curator.pop("operation", None)
            curator["status"] = {
                "conditions": [
                    {
                        **_job_condition(
                            "True",
                            "Job_has_finished",
                            f"{job} DesiredCuration: upgrade Version ({info})",
                        ),
                        "lastTransitionTime": _now(),
                    }
                ]
            }
            with self._lock:
                member.version = running.target  # the member runs it; the hub learns it later
            self._pending_versions[running.cluster] = (now + self.version_lag, running.target)
            self._replace_curator(curator)
            del self._curations[key]
            return
        if fraction >= 0.3 and running.hosted and running.failure is None:
            # pkg/jobs/hypershift/hypershift.go UpgradeCluster: patchUpgradeVersion sets the
            # HostedCluster's spec.release.image to the release of desiredUpdate (its
            # "quay.io/openshift-release-dev/ocp-release:<version>-multi"; NodePools alike).
            image = f"quay.io/openshift-release-dev/ocp-release:{running.target}-multi"
            self._custom.patch_namespaced_custom_object(
                *HOSTED_CLUSTER[:2],
                namespace,
                HOSTED_CLUSTER[2],
                name,
                {"spec": {"release": {"image": image}}},
            )
        if fraction >= 0.3:
            percent = min(99, int(fraction * 100))
            conds = _set_condition(
                conds,
                {
                    "type": "upgrade-cluster",
                    "status": "True",
                    "reason": "Job_has_finished",
                    "message": "Completed executing init container",
                },
            )
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

    def _cluster_info(self, cluster: str) -> dict[str, Any] | None:
        try:
            return dict(
                self._custom.get_namespaced_custom_object(MCI[0], MCI[1], cluster, MCI[2], cluster)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

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
                    # The work agent writes "" here; metav1.Condition requires message and the
                    # 1.20 test server turns "" into null (a quirk of the test server), so a
                    # non-empty message stands in.
                    "message": "Status feedback synced" if values else "No status feedback",
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


# -- the cluster curator's rules (stolostron/cluster-curator-controller @ 2a35aed) ---------------


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _job_condition(status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": "clustercurator-job", "status": status, "reason": reason, "message": message}


def _conditions(obj: Mapping[str, Any]) -> list[Any]:
    return list((obj.get("status") or {}).get("conditions") or [])


def curator_update_passes(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """The controller's update predicate (controllers/clustercurator_controller.go,
    newClusterCuratorPredicate), in its order: an update whose status changed is dropped
    unless it clears desiredCuration or curatorJob (the job's own end), and so is any update
    while the old spec.upgrade.intermediateUpdate is set or while `operation` stays the same.
    """
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    if new_spec.get("desiredCuration") == "delete-cluster-namespace":
        return True
    new_op, old_op = new.get("operation"), old.get("operation")
    same_op = (new_op or {}).get("retryPosthook", "") == (old_op or {}).get("retryPosthook", "")
    if new_op is not None and old_op is not None and same_op:
        return False
    if new_op is not None and (new_op or {}).get("retryPosthook"):
        return True
    if new_spec.get("desiredCuration", "") != old_spec.get(
        "desiredCuration", ""
    ) and not new_spec.get("desiredCuration"):
        return True
    if new_spec.get("curatorJob", "") != old_spec.get("curatorJob", "") and not new_spec.get(
        "curatorJob"
    ):
        return True
    if _conditions(new) != _conditions(old):
        return False
    return not (old_spec.get("upgrade") or {}).get("intermediateUpdate")


def version_info(upgrade: Mapping[str, Any]) -> str:
    """pkg/jobs/utils/helpers.go GetCurrentVersionInfo: desired;channel;upstream;type;pools."""
    pools = ",".join(upgrade.get("nodePoolNames") or [])
    return (
        ";".join(
            str(upgrade.get(k) or "")
            for k in ("desiredUpdate", "channel", "upstream", "upgradeType")
        )
        + f";{pools}"
    )


_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def _semver(text: str) -> tuple[int, int, int, int, str] | None:
    """blang/semver Make, reduced to ordering: None when it does not parse."""
    match = _SEMVER.match(text)
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    return int(major), int(minor), int(patch), 0 if pre else 1, pre or ""


def need_to_upgrade(curator: Mapping[str, Any], cluster_info: Mapping[str, Any] | None) -> bool:
    """pkg/jobs/utils/helpers.go NeedToUpgrade: whether an upgrade curation launches a job.

    No clustercurator-job condition: yes, unless the ManagedClusterInfo cannot be read or
    already shows desiredUpdate. A job still running: no. The last job was no upgrade: yes.
    The last upgrade failed with the same desiredUpdate;channel;upstream (and type, pools):
    no. Otherwise yes when desiredUpdate is newer than the last job's version, or the channel,
    upstream, type or pools differ.
    """
    upgrade = (curator.get("spec") or {}).get("upgrade") or {}
    desired = str(upgrade.get("desiredUpdate") or "")
    job = next((c for c in _conditions(curator) if c.get("type") == "clustercurator-job"), None)
    if job is None:
        if desired:
            if cluster_info is None:
                return False  # "Could not determine current cluster version ... skipping"
            ocp = ((cluster_info.get("status") or {}).get("distributionInfo") or {}).get(
                "ocp"
            ) or {}
            if ocp.get("version") == desired:
                return False
        return True
    if job.get("status") == "False":
        return False
    message = str(job.get("message") or "")
    if "upgrade" not in message:
        return True
    upgrade_type = str(upgrade.get("upgradeType") or "")
    pools = ",".join(upgrade.get("nodePoolNames") or [])
    extended = _version_parts(message)
    if "Failed" in message:
        basic = f"{desired};{upgrade.get('channel') or ''};{upgrade.get('upstream') or ''}"
        if basic in message:
            was_type = extended[3] if extended and len(extended) > 3 else ""
            was_pools = extended[4] if extended and len(extended) > 4 else ""
            return not (upgrade_type == was_type and pools == was_pools)
        return f"Version ({desired})" not in message
    wanted = _semver(desired or "0.0.0")
    if wanted is None:
        return False  # semver.Make fails: the reconcile errors out
    if extended is None or len(extended) < 3:
        return True
    done = _semver(extended[0] or "0.0.0")
    if done is None:
        return True
    channel, upstream = str(upgrade.get("channel") or ""), str(upgrade.get("upstream") or "")
    return (
        wanted > done
        or (bool(channel) and channel != extended[1])
        or (bool(upstream) and upstream != extended[2])
        or upgrade_type != (extended[3] if len(extended) > 3 else "")
        or pools != (extended[4] if len(extended) > 4 else "")
    )


def _version_parts(message: str) -> list[str] | None:
    """parseVersionInfo / parseExtendedVersionInfo: the ;-separated fields in (...)."""
    start = message.find("(")
    if start == -1:
        return None
    end = message.find(")", start)
    if end == -1:
        return None
    return message[start + 1 : end].split(";")


def _validate_upgrade(
    desired: str, upgrade: Mapping[str, Any], cluster_info: Mapping[str, Any] | None
) -> str:
    """pkg/jobs/hive/hive.go validateUpgradeVersion (no force annotation): the error, or ""."""
    if cluster_info is None:
        return f'managedclusterinfos.internal.open-cluster-management.io "{desired}" not found'
    status = cluster_info.get("status") or {}
    if status.get("kubeVendor") not in ("OpenShift", "OpenShiftDedicated"):
        return "Can not upgrade non openshift cluster"
    ocp = (status.get("distributionInfo") or {}).get("ocp") or {}
    if desired and desired not in (ocp.get("availableUpdates") or []):
        return "Provided version is not valid"
    channel = str(upgrade.get("channel") or "")
    if channel and channel not in ((ocp.get("desired") or {}).get("channels") or []):
        return "Provided channel is not valid"
    return ""


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
