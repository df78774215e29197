"""An Amazon EKS API emulator for tests: the EKS operations the EKS plugin uses, served on
loopback in EKS's rest-json protocol, so boto3 talks to it unchanged:

    boto3.client("eks", region_name="us-east-1", endpoint_url=emulator.endpoint)

Wire shapes, paths and error codes follow botocore's service model,
botocore/data/eks/2017-11-01/service-2.json (the operations' "http.requestUri", the
request/response shapes, the error shapes' "httpStatusCode"). Errors are sent as rest-json
errors are: the HTTP status of the error shape, an `x-amzn-ErrorType` header naming it and a
JSON body {"message": ...} (botocore/parsers.py, RestJSONParser._do_error_parse reads both).

The region of a request is read from its SigV4 credential scope (Authorization header,
"Credential=KEY/DATE/REGION/eks/aws4_request"), as EKS's regional endpoints are separate
services: a cluster lives in one region.

moto's EKS backend is not used: moto 5.1.18 (moto/eks/urls.py, models.py) serves clusters,
node groups, fargate profiles, update-config and tags, but none of UpdateClusterVersion,
UpdateNodegroupVersion, DescribeUpdate, ListUpdates, DescribeClusterVersions or the insights,
which are what these tests are about.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.eks_emulator._http import Answer, LoopbackServer

__all__ = ["ACCOUNT", "EksEmulator", "EksError"]

ACCOUNT = "123456789012"
_SCOPE = re.compile(r"Credential=([^/]+)/\d{8}/([a-z0-9-]+)/eks/aws4_request")


class EksError(Exception):
    """An EKS error shape: its name (x-amzn-ErrorType), HTTP status and message."""

    def __init__(self, name: str, status: int, message: str) -> None:
        super().__init__(message)
        self.name, self.status, self.message = name, status, message


# HTTP statuses of the error shapes in service-2.json ("error": {"httpStatusCode": N}).
def _in_use(message: str) -> EksError:
    return EksError("ResourceInUseException", 409, message)


def _invalid_parameter(message: str) -> EksError:
    return EksError("InvalidParameterException", 400, message)


def _invalid_request(message: str) -> EksError:
    return EksError("InvalidRequestException", 400, message)


def _not_found(message: str) -> EksError:
    return EksError("ResourceNotFoundException", 404, message)


FAULTS = {
    "ThrottlingException": 429,
    "ServerException": 500,
    "ServiceUnavailableException": 503,
}
"""Transient errors a test may inject (service-2.json: ThrottlingException 429,
ServerException 500, ServiceUnavailableException 503)."""


@dataclass
class _Nodegroup:
    name: str
    version: str
    release_version: str
    status: str = "ACTIVE"
    issues: list[dict[str, Any]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class _Update:
    id: str
    cluster: str
    nodegroup: str
    version: str
    token: str
    created: float
    status: str = "InProgress"
    errors: list[dict[str, Any]] = field(default_factory=list)
    fail_with: tuple[str, str, str] | None = None  # (status, errorCode, errorMessage)


@dataclass
class _Cluster:
    region: str
    name: str
    version: str
    platform: str
    tags: dict[str, str]
    status: str = "ACTIVE"
    nodegroups: dict[str, _Nodegroup] = field(default_factory=dict)
    updates: dict[str, _Update] = field(default_factory=dict)
    insights: list[dict[str, Any]] = field(default_factory=list)

    @property
    def arn(self) -> str:
        return f"arn:aws:eks:{self.region}:{ACCOUNT}:cluster/{self.name}"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


class EksEmulator:
    """EKS on loopback: clusters, managed node groups, updates that take time, version offers,
    upgrade insights, and injectable faults. Use as a context manager."""

    def __init__(self, update_seconds: float = 0.3) -> None:
        self.update_seconds = update_seconds
        self.held = False  # True: updates stay InProgress (a test's fixed "in flight" moment)
        self.held_clusters: set[str] = set()  # only these clusters' updates stay InProgress
        self._lock = threading.RLock()
        self._clusters: dict[tuple[str, str], _Cluster] = {}
        self._versions: list[dict[str, Any]] = []
        self._faults: dict[str, list[str]] = {}
        self._calls: Counter[str] = Counter()
        self._bodies: dict[str, list[dict[str, Any]]] = {}
        self._access_keys: set[str] = set()
        self._server = LoopbackServer(self._dispatch)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> EksEmulator:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    # ------------------------------------------------------------------ test set-up

    def set_versions(self, offered: dict[str, str]) -> None:
        """The versions DescribeClusterVersions lists: version -> status
        (ClusterVersionStatus: "standard-support", "extended-support", "unsupported")."""
        with self._lock:
            self._versions = [
                {
                    "clusterVersion": version,
                    "clusterType": "eks",
                    "status": status,
                    "versionStatus": status.upper().replace("-", "_"),
                    "defaultVersion": False,
                }
                for version, status in offered.items()
            ]

    def add_cluster(
        self,
        region: str,
        name: str,
        version: str,
        nodegroups: list[str],
        tags: dict[str, str] | None = None,
    ) -> str:
        """A cluster at version with managed node groups at the same version; returns its ARN."""
        with self._lock:
            cluster = _Cluster(region, name, version, "eks.1", dict(tags or {}))
            for ng in nodegroups:
                cluster.nodegroups[ng] = _Nodegroup(ng, version, f"{version}.0-20240101")
            self._clusters[(region, name)] = cluster
            return cluster.arn

    def add_insight(
        self, region: str, cluster: str, version: str, status: str, reason: str, name: str
    ) -> str:
        """An UPGRADE_READINESS insight of the cluster for a target version; returns its id."""
        with self._lock:
            insight_id = str(uuid.uuid4())
            self._cluster(region, cluster).insights.append(
                {
                    "id": insight_id,
                    "name": name,
                    "category": "UPGRADE_READINESS",
                    "kubernetesVersion": version,
                    "lastRefreshTime": time.time(),
                    "lastTransitionTime": time.time(),
                    "description": f"Checks for {name} before upgrading to {version}",
                    "insightStatus": {"status": status, "reason": reason},
                    "recommendation": "Fix what the insight names, then wait for its refresh.",
                }
            )
            return insight_id

    def set_nodegroup_issues(
        self, region: str, cluster: str, nodegroup: str, issues: list[tuple[str, str]]
    ) -> None:
        """Health issues of a node group ((code, message), NodegroupIssueCode); any issue makes
        its status DEGRADED, none makes it ACTIVE again."""
        with self._lock:
            ng = self._cluster(region, cluster).nodegroups[nodegroup]
            ng.issues = [{"code": c, "message": m, "resourceIds": []} for c, m in issues]
            ng.status = "DEGRADED" if issues else "ACTIVE"

    def fail_next_update(
        self,
        region: str,
        cluster: str,
        *,
        nodegroup: str = "",
        status: str = "Failed",
        error_code: str = "PodEvictionFailure",
        message: str = "Reached max retries while trying to evict pods from nodes",
    ) -> None:
        """The next update of the cluster (or node group) ends Failed or Cancelled with that
        ErrorDetail (ErrorCode enum) instead of Successful."""
        with self._lock:
            self._pending_fault = (region, cluster, nodegroup, (status, error_code, message))

    _pending_fault: tuple[str, str, str, tuple[str, str, str]] | None = None

    def inject(self, operation: str, error: str, count: int = 1) -> None:
        """The next count calls of operation (e.g. "UpdateClusterVersion") answer error, one of
        FAULTS, before doing anything."""
        with self._lock:
            self._faults.setdefault(operation, []).extend([error] * count)

    # ------------------------------------------------------------------ inspection

    def calls(self, operation: str) -> int:
        """How many times an operation was called (faults included)."""
        with self._lock:
            return self._calls[operation]

    def access_keys(self) -> set[str]:
        """The access key ids requests were signed with ("" for an unsigned request)."""
        with self._lock:
            return set(self._access_keys)

    def called(self) -> set[str]:
        """The names of every operation called at least once."""
        with self._lock:
            return {name for name, count in self._calls.items() if count}

    def requests(self, operation: str) -> list[dict[str, Any]]:
        """The JSON bodies an operation received, oldest first."""
        with self._lock:
            return [dict(b) for b in self._bodies.get(operation, [])]

    def cluster(self, region: str, name: str) -> dict[str, Any]:
        """The cluster now: version, status, node group versions/statuses, update statuses."""
        with self._lock:
            self._advance()
            c = self._cluster(region, name)
            return {
                "version": c.version,
                "status": c.status,
                "nodegroups": {n.name: n.version for n in c.nodegroups.values()},
                "nodegroupStatus": {n.name: n.status for n in c.nodegroups.values()},
                "updates": [(u.nodegroup, u.version, u.status) for u in c.updates.values()],
            }

    # ------------------------------------------------------------------ the clock

    def _advance(self) -> None:
        """Updates end update_seconds after they were created (EKS reports an update
        InProgress, then Successful, Failed or Cancelled: Update.status, UpdateStatus enum)."""
        if self.held:
            return
        now = time.monotonic()
        for c in self._clusters.values():
            if c.name in self.held_clusters:
                continue
            for u in c.updates.values():
                if u.status != "InProgress" or now - u.created < self.update_seconds:
                    continue
                if u.fail_with is not None:
                    u.status, code, message = u.fail_with
                    u.errors = [{"errorCode": code, "errorMessage": message, "resourceIds": []}]
                else:
                    u.status = "Successful"
                    if u.nodegroup:
                        ng = c.nodegroups[u.nodegroup]
                        ng.version, ng.release_version = u.version, f"{u.version}.0-20240601"
                    else:
                        c.version = u.version
                if u.nodegroup:
                    ng = c.nodegroups[u.nodegroup]
                    ng.status = "DEGRADED" if ng.issues else "ACTIVE"
                else:
                    c.status = "ACTIVE"

    # ------------------------------------------------------------------ the wire

    def _cluster(self, region: str, name: str) -> _Cluster:
        cluster = self._clusters.get((region, name))
        if cluster is None:
            raise _not_found(f"No cluster found for name: {name}.")
        return cluster

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        raw: bytes,
    ) -> Answer:
        body: dict[str, Any] = json.loads(raw) if raw else {}
        scope = _SCOPE.search(headers.get("authorization", ""))
        region = scope.group(2) if scope else "us-east-1"
        with self._lock:
            self._access_keys.add(scope.group(1) if scope else "")
        for verb, pattern, name, handler in _ROUTES:
            match = re.fullmatch(pattern, path)
            if verb != method or match is None:
                continue
            try:
                with self._lock:
                    self._calls[name] += 1
                    self._bodies.setdefault(name, []).append(body)
                    faults = self._faults.get(name)
                    if faults:
                        fault = faults.pop(0)
                        raise EksError(fault, FAULTS[fault], "Rate exceeded or service error")
                    self._advance()
                    answer = handler(self, region, match.groups(), query, body)
                return _json(200, answer, "")
            except EksError as err:
                return _json(err.status, {"message": err.message}, err.name)
        return _json(404, {"message": f"no route {method} {path}"}, "NotFound")

    # --- handlers (one per operation; paths from service-2.json "requestUri") --------

    def _list_clusters(self, region: str, _: Any, query: Any, __: Any) -> Any:
        # GET /clusters: {"clusters": [names], "nextToken"}; maxResults 1..100.
        names = sorted(n for (r, n) in self._clusters if r == region)
        return _page(names, query, "clusters")

    def _describe_cluster(self, region: str, groups: Any, _: Any, __: Any) -> Any:
        # GET /clusters/{name}: {"cluster": Cluster}.
        c = self._cluster(region, groups[0])
        return {
            "cluster": {
                "name": c.name,
                "arn": c.arn,
                "version": c.version,
                "platformVersion": c.platform,
                "status": c.status,
                "tags": c.tags,
                "createdAt": 1700000000.0,
            }
        }

    def _list_nodegroups(self, region: str, groups: Any, query: Any, _: Any) -> Any:
        # GET /clusters/{name}/node-groups: {"nodegroups": [names], "nextToken"}.
        c = self._cluster(region, groups[0])
        return _page(sorted(c.nodegroups), query, "nodegroups")

    def _describe_nodegroup(self, region: str, groups: Any, _: Any, __: Any) -> Any:
        # GET /clusters/{name}/node-groups/{nodegroupName}: {"nodegroup": Nodegroup}.
        c = self._cluster(region, groups[0])
        ng = c.nodegroups.get(groups[1])
        if ng is None:
            raise _not_found(f"No node group found for name: {groups[1]}.")
        return {
            "nodegroup": {
                "nodegroupName": ng.name,
                "clusterName": c.name,
                "nodegroupArn": f"arn:aws:eks:{region}:{ACCOUNT}:nodegroup/{c.name}/{ng.name}/x",
                "version": ng.version,
                "releaseVersion": ng.release_version,
                "status": ng.status,
                "health": {"issues": ng.issues},
                "tags": ng.tags,
            }
        }

    def _describe_cluster_versions(self, _: str, __: Any, query: Any, ___: Any) -> Any:
        # GET /cluster-versions: {"clusterVersions": [ClusterVersionInformation]}. Without
        # includeAll, EKS lists only versions it still supports (not "unsupported").
        include_all = query.get("includeAll", ["false"])[0] == "true"
        versions = [v for v in self._versions if include_all or v["status"] != "unsupported"]
        return {"clusterVersions": versions}

    def _in_progress(self, c: _Cluster) -> _Update | None:
        return next((u for u in c.updates.values() if u.status == "InProgress"), None)

    def _start(self, c: _Cluster, nodegroup: str, version: str, token: str) -> dict[str, Any]:
        update = _Update(str(uuid.uuid4()), c.name, nodegroup, version, token, time.monotonic())
        fault = self._pending_fault
        if fault is not None and fault[:3] == (c.region, c.name, nodegroup):
            update.fail_with = fault[3]
            self._pending_fault = None
        c.updates[update.id] = update
        if nodegroup:
            c.nodegroups[nodegroup].status = "UPDATING"
        else:
            c.status = "UPDATING"
        return {"update": _update_json(update)}

    def _by_token(self, c: _Cluster, nodegroup: str, token: str) -> _Update | None:
        # clientRequestToken is EKS's idempotency token ("idempotencyToken": true in
        # service-2.json; "Unique, case-sensitive identifier that you provide to ensure the
        # idempotency of the request"): the same token on the same resource returns the update
        # it started, before any other check, and starts nothing.
        if not token:
            return None
        return next(
            (u for u in c.updates.values() if u.token == token and u.nodegroup == nodegroup),
            None,
        )

    def _update_cluster_version(self, region: str, groups: Any, _: Any, body: Any) -> Any:
        # POST /clusters/{name}/updates (UpdateClusterVersion).
        c = self._cluster(region, groups[0])
        target = str(body.get("version", ""))
        known = self._by_token(c, "", str(body.get("clientRequestToken", "")))
        if known is not None:
            return {"update": _update_json(known)}
        running = self._in_progress(c)
        if running is not None:
            # One update at a time per cluster, its node groups included (ResourceInUseException,
            # 409: "The specified resource is in use").
            raise _in_use(f"Cluster {c.name} has update {running.id} in progress")
        offered = {v["clusterVersion"] for v in self._versions if v["status"] != "unsupported"}
        if target not in offered:
            raise _invalid_parameter(f"unsupported Kubernetes version {target}")
        now, want = _minor(c.version), _minor(target)
        if want == now:
            raise _invalid_parameter(f"Cluster is already at the desired version {target}")
        if want < now:
            raise _invalid_parameter(f"Downgrade from {c.version} to {target} is not supported")
        if want != (now[0], now[1] + 1):
            # EKS upgrades one minor version at a time (UpdateClusterVersion: "Kubernetes
            # version upgrades are one minor version at a time").
            raise _invalid_parameter(
                f"Unsupported Kubernetes minor version update from {c.version} to {target}"
            )
        lagging = sorted(n.name for n in c.nodegroups.values() if n.version != c.version)
        if lagging:
            # UpdateClusterVersion: "all of your node groups' Kubernetes versions must match the
            # cluster's Kubernetes version in order to update the cluster".
            raise _invalid_request(f"Nodegroups {', '.join(lagging)} do not match {c.version}")
        if not body.get("force"):
            # UpdateClusterVersionRequest.force: "override upgrade-blocking ... readiness
            # checks"; InvalidStateException (400): "Amazon EKS detected upgrade readiness
            # issues": an ERROR UPGRADE_READINESS insight for the target blocks the update.
            blocking = [
                i["name"]
                for i in c.insights
                if i["kubernetesVersion"] == target and i["insightStatus"]["status"] == "ERROR"
            ]
            if blocking:
                raise EksError(
                    "InvalidStateException",
                    400,
                    f"Upgrade readiness checks failed for {target}: {', '.join(blocking)}",
                )
        return self._start(c, "", target, str(body.get("clientRequestToken", "")))

    def _update_nodegroup_version(self, region: str, groups: Any, _: Any, body: Any) -> Any:
        # POST /clusters/{name}/node-groups/{nodegroupName}/update-version.
        c = self._cluster(region, groups[0])
        ng = c.nodegroups.get(groups[1])
        if ng is None:
            raise _not_found(f"No node group found for name: {groups[1]}.")
        known = self._by_token(c, ng.name, str(body.get("clientRequestToken", "")))
        if known is not None:
            return {"update": _update_json(known)}
        running = self._in_progress(c)
        if running is not None:
            raise _in_use(f"Cluster {c.name} has update {running.id} in progress")
        # UpdateNodegroupVersionRequest.version: "If you don't specify a Kubernetes version,
        # Amazon EKS uses the version of the cluster"; a node group may not be newer.
        target = str(body.get("version") or c.version)
        if _minor(target) > _minor(c.version):
            raise _invalid_parameter(
                f"Requested Kubernetes version {target} is newer than the cluster's {c.version}"
            )
        if _minor(target) < _minor(ng.version):
            raise _invalid_parameter(f"Downgrade from {ng.version} to {target} is not supported")
        if ng.status not in ("ACTIVE",):
            # A DEGRADED node group (health issues) cannot be updated until they are resolved.
            raise _invalid_request(f"Nodegroup {ng.name} is in status {ng.status}")
        return self._start(c, ng.name, target, str(body.get("clientRequestToken", "")))

    def _describe_update(self, region: str, groups: Any, query: Any, _: Any) -> Any:
        # GET /clusters/{name}/updates/{updateId}?nodegroupName=: {"update": Update}.
        c = self._cluster(region, groups[0])
        update = c.updates.get(groups[1])
        nodegroup = query.get("nodegroupName", [""])[0]
        if update is None or update.nodegroup != nodegroup:
            raise _not_found(f"No update found for ID: {groups[1]}.")
        return {"update": _update_json(update)}

    def _list_updates(self, region: str, groups: Any, query: Any, _: Any) -> Any:
        # GET /clusters/{name}/updates?nodegroupName=: {"updateIds": [...]}.
        c = self._cluster(region, groups[0])
        nodegroup = query.get("nodegroupName", [""])[0]
        ids = [u.id for u in c.updates.values() if u.nodegroup == nodegroup]
        return _page(ids, query, "updateIds")

    def _list_insights(self, region: str, groups: Any, _: Any, body: Any) -> Any:
        # POST /clusters/{name}/insights with an InsightsFilter (categories,
        # kubernetesVersions, statuses): {"insights": [InsightSummary]}.
        c = self._cluster(region, groups[0])
        wanted = body.get("filter") or {}
        found = []
        for insight in c.insights:
            if wanted.get("categories") and insight["category"] not in wanted["categories"]:
                continue
            versions = wanted.get("kubernetesVersions")
            if versions and insight["kubernetesVersion"] not in versions:
                continue
            statuses = wanted.get("statuses")
            if statuses and insight["insightStatus"]["status"] not in statuses:
                continue
            found.append({k: v for k, v in insight.items() if k != "recommendation"})
        return {"insights": found}

    def _describe_insight(self, region: str, groups: Any, _: Any, __: Any) -> Any:
        # GET /clusters/{name}/insights/{id}: {"insight": Insight}.
        c = self._cluster(region, groups[0])
        for insight in c.insights:
            if insight["id"] == groups[1]:
                return {"insight": insight}
        raise _not_found(f"No insight found for ID: {groups[1]}.")


def _json(status: int, data: Any, error: str) -> Answer:
    headers = {"Content-Type": "application/json", "x-amzn-RequestId": str(uuid.uuid4())}
    if error:
        headers["x-amzn-ErrorType"] = f"{error}:http://internal.amazon.com/"
    return status, headers, json.dumps(data).encode()


def _page(items: list[str], query: dict[str, list[str]], key: str) -> dict[str, Any]:
    size = int(query.get("maxResults", ["100"])[0])
    start = int(query.get("nextToken", ["0"])[0])
    page: dict[str, Any] = {key: items[start : start + size]}
    if start + size < len(items):
        page["nextToken"] = str(start + size)
    return page


def _update_json(u: _Update) -> dict[str, Any]:
    # Update: id, status, type ("VersionUpdate"), params [{type: "Version", value}],
    # createdAt (a rest-json timestamp: epoch seconds), errors [ErrorDetail].
    params = [{"type": "Version", "value": u.version}]
    return {
        "id": u.id,
        "status": u.status,
        "type": "VersionUpdate",
        "params": params,
        "createdAt": time.time() - (time.monotonic() - u.created),
        "errors": u.errors,
    }


_Handler = Callable[[EksEmulator, str, Any, Any, Any], Any]
_N = r"([^/]+)"
_ROUTES: list[tuple[str, str, str, _Handler]] = [
    ("GET", r"/clusters", "ListClusters", EksEmulator._list_clusters),
    ("GET", rf"/clusters/{_N}", "DescribeCluster", EksEmulator._describe_cluster),
    ("GET", rf"/clusters/{_N}/node-groups", "ListNodegroups", EksEmulator._list_nodegroups),
    (
        "GET",
        rf"/clusters/{_N}/node-groups/{_N}",
        "DescribeNodegroup",
        EksEmulator._describe_nodegroup,
    ),
    (
        "GET",
        r"/cluster-versions",
        "DescribeClusterVersions",
        EksEmulator._describe_cluster_versions,
    ),
    (
        "POST",
        rf"/clusters/{_N}/updates",
        "UpdateClusterVersion",
        EksEmulator._update_cluster_version,
    ),
    (
        "POST",
        rf"/clusters/{_N}/node-groups/{_N}/update-version",
        "UpdateNodegroupVersion",
        EksEmulator._update_nodegroup_version,
    ),
    ("GET", rf"/clusters/{_N}/updates/{_N}", "DescribeUpdate", EksEmulator._describe_update),
    ("GET", rf"/clusters/{_N}/updates", "ListUpdates", EksEmulator._list_updates),
    ("POST", rf"/clusters/{_N}/insights", "ListInsights", EksEmulator._list_insights),
    ("GET", rf"/clusters/{_N}/insights/{_N}", "DescribeInsight", EksEmulator._describe_insight),
]
