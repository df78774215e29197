"""Control-plane upgrades of ManagedClusters, and PreflightUpgrade (what one would do now).

The upgrade is asked of ACM's ClusterCurator (curator.py) or of a ManifestWork that sets the
cluster's version (work.py), as the configuration chooses; the object carries our annotations
(request id, operation id, start time), so a restarted plugin finds its upgrade again. OCM never
downgrades; a cluster already at the version answers SUCCEEDED at once. Once started, the
follower (follower.py) ends the operation; its start and end are recorded in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm import curator, inventory, work
from plugins.ocm.caches import RETRIES, HubCaches
from plugins.ocm.follower import Follower
from plugins.ocm.hub import (
    CLUSTER_CURATORS,
    MANAGED_CLUSTER_INFOS,
    MANIFEST_WORKS,
)
from plugins.ocm.ledger import operation_id_for
from plugins.ocm.objects import (
    ANNOTATION_REQUEST_ID,
    ANNOTATION_STARTED_AT,
    annotations_of,
    parse_time,
    version_reached,
)
from plugins.ocm.taints import Taints
from plugins.sdk import (
    FailedPrecondition,
    Kube,
    KubeConflict,
    KubeError,
    KubeNotFound,
    OperationStore,
    Reason,
    Unavailable,
    accepted,
    is_downgrade,
    refused_later,
    refused_never,
)

__all__ = ["Upgrades"]

_UPGRADE = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED


class Upgrades:
    """UpgradeControlPlane and PreflightUpgrade on one hub.

    require_synced: raises Unavailable until the hub is listed and its operations adopted;
    wake: asks the follower to look at the caches again.
    """

    def __init__(
        self,
        hub: Kube,
        caches: HubCaches,
        store: OperationStore,
        taints: Taints,
        follower: Follower,
        require_synced: Callable[[], None],
        wake: Callable[[], None],
    ) -> None:
        self.cfg = caches.cfg
        self._hub = hub
        self._caches = caches
        self._store = store
        self._taints = taints
        self._follower = follower
        self._require_synced = require_synced
        self._wake = wake

    def _upgrade_refusal(self, cluster: str, obj: Mapping[str, Any], version: str) -> None:
        """Raises what UpgradeControlPlane would refuse (downgrade) before anything is written."""
        current = self._caches.version(obj)
        try:
            downgrade = is_downgrade(current, version)
        except ValueError:
            downgrade = False  # no readable version: let the upgrade say what it runs
        if downgrade:
            raise FailedPrecondition(
                f"version: cluster {self._caches.qualified(cluster)} runs {current}, newer than "
                f"{version}; OCM upgrades never downgrade",
                reason=Reason.DOWNGRADE_NOT_SUPPORTED,
            )

    def _curator_namespace(self, cluster: str) -> str:
        """Where the cluster's ClusterCurator goes (HubCaches.curator_namespace), or raises
        for a HyperShift hosted cluster the configuration does not let this plugin curate.

        The curator controller takes its hosted path only when a HostedCluster named like the
        ClusterCurator sits in the ClusterCurator's namespace (cluster-curator-controller,
        controllers/clustercurator_controller.go isHostedCluster; the job then patches
        hypershift.openshift.io HostedCluster and NodePools in that namespace,
        pkg/jobs/hypershift UpgradeCluster). A ClusterCurator <cluster>/<cluster> for a
        HostedCluster <cluster> in another namespace would be curated as if standalone: with
        clusterCurator.hostedClusters Refuse (the default) that is refused; with
        HostedClusterNamespace the curator goes into the HostedCluster's namespace, unless
        HostedClusters of that name sit in several (ambiguous: refused). One in namespace
        <cluster> takes the hosted path as it is. Read from the HostedCluster watch cache
        (HubCaches.hosted, no hub call per request); no HostedCluster API on the hub, or none
        granted: not hosted."""
        qualified = self._caches.qualified(cluster)
        elsewhere = [ns for ns in self._caches.hosted_namespaces(cluster) if ns != cluster]
        if not elsewhere:
            return cluster
        hosted_mode = self.cfg.cluster_curator.hosted_clusters == "HostedClusterNamespace"
        if hosted_mode and len(elsewhere) == 1:
            return elsewhere[0]
        if hosted_mode:
            raise FailedPrecondition(
                f"cluster {qualified} is a HyperShift hosted cluster with HostedClusters "
                f"{', '.join(f'{ns}/{cluster}' for ns in elsewhere)}: which one the "
                "ManagedCluster is cannot be told, so no ClusterCurator is written; remove the "
                "stale HostedCluster or leave the cluster out of this run",
                reason="HOSTED_CLUSTER_AMBIGUOUS",
            )
        raise FailedPrecondition(
            f"cluster {qualified} is a HyperShift hosted cluster "
            f"(HostedCluster {elsewhere[0]}/{cluster}): the curator upgrades it only from a "
            f"ClusterCurator in namespace {elsewhere[0]}, and this plugin writes "
            f"ClusterCurator {cluster}/{cluster}, which the curator would run as a "
            "standalone upgrade. Set clusterCurator.hostedClusters: HostedClusterNamespace "
            "to have the plugin write it there, or upgrade hosted clusters with a "
            "ClusterCurator of your own there and leave them out of this run",
            reason="HOSTED_CLUSTER_NOT_SUPPORTED",
        )

    def upgrade_control_plane(
        self, request_id: str, cluster: str, version: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds) the upgrade by ClusterCurator or ManifestWork."""
        cluster_id = self._caches.qualified(cluster)
        with self._caches.lock_for(cluster):
            self._require_synced()
            obj = self._caches.managed_cluster(cluster)
            if self._store.lookup(request_id) is not None:
                return self._store.start(
                    request_id=request_id,
                    kind=_UPGRADE,
                    cluster_id=cluster_id,
                    target_version=version,
                )[0]
            self._store.ensure_free(cluster_id)
            self._upgrade_refusal(cluster, obj, version)
            if self.cfg.upgrade_method == "ClusterCurator":
                self._curator_namespace(cluster)  # raises for a hosted cluster it cannot curate
            op_id = operation_id_for(request_id)
            if version_reached(self._caches.version(obj), version):
                self._taints.write(
                    cluster,
                    add=None,
                    record=self._taints.record(request_id, _UPGRADE, _SUCCEEDED, version),
                )
                return self._store.start(
                    request_id=request_id,
                    kind=_UPGRADE,
                    cluster_id=cluster_id,
                    target_version=version,
                    initial_state=_SUCCEEDED,
                    op_id=op_id,
                )[0]
            now = datetime.now(UTC)
            if self.cfg.upgrade_method == "ClusterCurator":
                started = self._start_curation(cluster, version, request_id, op_id, now)
            else:
                started = self._start_work(cluster, version, request_id, op_id, now)
            op, created = self._store.start(
                request_id=request_id,
                kind=_UPGRADE,
                cluster_id=cluster_id,
                target_version=version,
                initial_state=_RUNNING,
                op_id=op_id,
            )
            if created:
                self._follower.follow(op.id, started)
                self._taints.ledger(cluster, op)
        self._wake()
        return op

    def _start_curation(
        self, cluster: str, version: str, request_id: str, op_id: str, now: datetime
    ) -> datetime:
        """Creates or patches ClusterCurator <namespace>/<cluster> (namespace: the cluster's,
        or a hosted cluster's HostedCluster namespace); returns the start time."""
        ns = self._curator_namespace(cluster)
        reset = False  # this call cleared the curator's status
        patch = curator.curator_patch(self.cfg, cluster, version, request_id, op_id, now, ns)
        for _ in range(RETRIES):
            try:
                current = self._hub.get(CLUSTER_CURATORS, ns, cluster)
            except KubeNotFound:
                current = None
            except KubeError as exc:
                raise self._caches.unavailable("read the ClusterCurator", exc) from exc
            if current is not None:
                notes = annotations_of(current)
                if notes.get(ANNOTATION_REQUEST_ID) == request_id:  # ours, from before a restart
                    return parse_time(notes.get(ANNOTATION_STARTED_AT)) or now
                job = curator.running_job(current)
                if job and reset and curator.asks_for(current, patch):
                    # The controller acted on our reset: a reconcile queued by the last
                    # curation's end (its predicate passes a write that clears curatorJob) ran
                    # between our two writes, found no failed record and launched the curation
                    # we ask for. It is ours: annotated as ours, it is followed as ours.
                    rv = current["metadata"]["resourceVersion"]
                    mark = {"metadata": {**patch["metadata"], "resourceVersion": rv}}
                    try:
                        self._hub.merge_patch(CLUSTER_CURATORS, ns, cluster, mark)
                    except KubeConflict:
                        continue
                    except KubeError as exc:
                        raise self._caches.unavailable("annotate the ClusterCurator", exc) from exc
                    return now
                if job:
                    raise FailedPrecondition(
                        f"ClusterCurator {ns}/{cluster} is running curation job {job}; "
                        "wait until it ends, then retry",
                        reason=Reason.CLUSTER_BUSY,
                        retryable=True,
                    )
                step = curator.intermediate_update(current)
                if step:
                    raise FailedPrecondition(
                        f"ClusterCurator {ns}/{cluster}: spec.upgrade.intermediateUpdate is "
                        f"{step} (an EUS upgrade): the curator controller ignores every update "
                        "of it and desiredUpdate cannot change; finish or remove that curator"
                    )
            try:
                if current is None:
                    body = {
                        "apiVersion": f"{CLUSTER_CURATORS.group}/{CLUSTER_CURATORS.version}",
                        "kind": "ClusterCurator",
                        **patch,
                    }
                    self._hub.create(CLUSTER_CURATORS, ns, body)
                    return now
                version_read = current["metadata"]["resourceVersion"]
                if curator.needs_reset(current, version):
                    # Its own write: the controller drops it (status changed) and starts
                    # nothing, unless a reconcile queued before runs now (handled above).
                    cleared = {
                        **curator.RESET_PATCH,
                        "metadata": {"resourceVersion": version_read},
                    }
                    written = self._hub.merge_patch(CLUSTER_CURATORS, ns, cluster, cleared)
                    reset = True
                    version_read = written["metadata"]["resourceVersion"]
                # The status untouched: the controller acts on this one.
                ask = {**patch, "metadata": {**patch["metadata"], "resourceVersion": version_read}}
                self._hub.merge_patch(CLUSTER_CURATORS, ns, cluster, ask)
                return now
            except KubeConflict:
                continue
            except KubeError as exc:
                raise self._caches.unavailable("write the ClusterCurator", exc) from exc
        raise Unavailable(f"hub: ClusterCurator {ns}/{cluster} kept changing; retry")

    def _start_work(
        self, cluster: str, version: str, request_id: str, op_id: str, now: datetime
    ) -> datetime:
        """Creates or replaces the upgrade ManifestWork in the cluster namespace."""
        mw = self.cfg.manifest_work
        assert mw is not None
        for _ in range(RETRIES):
            try:
                current = self._hub.get(MANIFEST_WORKS, cluster, mw.name)
            except KubeNotFound:
                current = None
            except KubeError as exc:
                raise self._caches.unavailable("read the upgrade ManifestWork", exc) from exc
            if current is not None:
                notes = annotations_of(current)
                if notes.get(ANNOTATION_REQUEST_ID) == request_id:
                    return parse_time(notes.get(ANNOTATION_STARTED_AT)) or now
            body = work.upgrade_work(mw, cluster, version, request_id, op_id, now)
            try:
                if current is None:
                    self._hub.create(MANIFEST_WORKS, cluster, body)
                else:
                    meta = current["metadata"]
                    body["metadata"]["labels"] = {
                        **(meta.get("labels") or {}),
                        **body["metadata"]["labels"],
                    }
                    body["metadata"]["annotations"] = {
                        **(meta.get("annotations") or {}),
                        **body["metadata"]["annotations"],
                    }
                    body["metadata"]["resourceVersion"] = meta["resourceVersion"]
                    self._hub.replace(MANIFEST_WORKS, cluster, mw.name, body)
                return now
            except KubeConflict:
                continue
            except KubeError as exc:
                raise self._caches.unavailable("write the upgrade ManifestWork", exc) from exc
        raise Unavailable(f"hub: ManifestWork {cluster}/{mw.name} kept changing; retry")

    # -- preflight ---------------------------------------------------------------------------

    def preflight_upgrade(
        self, cluster: str, version: str, node_pools: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """Whether UpgradeControlPlane to version would start now (nothing is written).

        UNAVAILABLE when the hub does not answer; NOT_FOUND for an unknown cluster.
        """
        self._require_reachable()
        cluster_id = self._caches.qualified(cluster)
        obj = self._caches.managed_cluster(cluster)
        if node_pools:
            return refused_never(
                "NODE_POOLS_NOT_SUPPORTED",
                "OCM reports no node pools: upgrade the control plane (the chosen method "
                "upgrades the whole cluster)",
            )
        if not version:
            return accepted()
        try:
            self._upgrade_refusal(cluster, obj, version)
        except FailedPrecondition as exc:
            return refused_never(exc.reason, exc.message)
        busy = self._store.in_flight(cluster_id)
        if busy is not None:
            return refused_later(
                Reason.CLUSTER_BUSY,
                f"cluster {cluster_id} has operation {busy.id} in flight; ask again when it ends",
            )
        if version_reached(self._caches.version(obj), version):
            return accepted()  # nothing to do: UpgradeControlPlane answers SUCCEEDED at once
        available, why = inventory.availability(obj)
        if not available:
            return refused_later(
                Reason.CLUSTER_UNAVAILABLE,
                f"cluster {cluster_id} is not available ({why}); its agents cannot upgrade it",
            )
        if self._caches.curators is None:
            return accepted()
        return self._curator_preflight(cluster, cluster_id, version)

    def _curator_preflight(
        self, cluster: str, cluster_id: str, version: str
    ) -> cluster_pb2.PreflightUpgradeResponse:
        try:
            ns = self._curator_namespace(cluster)
        except FailedPrecondition as exc:
            return refused_never(exc.reason, exc.message)
        # Read, not cached: the cache holds only curators this plugin wrote, and ACM's own
        # curator of the cluster is the one an upgrade would write.
        try:
            existing: dict[str, Any] | None = self._hub.get(CLUSTER_CURATORS, ns, cluster)
        except KubeNotFound:
            existing = None
        except KubeError as exc:
            raise self._caches.unavailable("read the ClusterCurator", exc) from exc
        if existing is not None:
            job = curator.running_job(existing)
            if job:
                return refused_later(
                    Reason.CLUSTER_BUSY,
                    f"ClusterCurator {ns}/{cluster} is running curation job {job}",
                )
            step = curator.intermediate_update(existing)
            if step:
                return refused_never(
                    "INTERMEDIATE_UPDATE",
                    f"ClusterCurator {ns}/{cluster} carries intermediateUpdate {step}: "
                    "the curator controller ignores its updates",
                )
        try:
            info: dict[str, Any] | None = self._hub.get(MANAGED_CLUSTER_INFOS, cluster, cluster)
        except KubeNotFound:
            # NeedToUpgrade (pkg/jobs/utils/helpers.go) starts no first upgrade of a curator
            # without it; ACM's foundation agent creates it when the cluster is imported.
            return refused_later(
                "CLUSTER_INFO_MISSING",
                f"cluster {cluster_id} has no ManagedClusterInfo {cluster}/{cluster} on hub "
                f"{self._caches.name}: the curator controller starts no upgrade without it",
            )
        except KubeError as exc:
            if exc.status in (401, 403):
                info = None  # not readable with this role: the curation decides
            else:
                raise self._caches.unavailable("read the ManagedClusterInfo", exc) from exc
        return curator.curator_preflight(cluster_id, version, self.cfg, info)

    def _require_reachable(self) -> None:
        """Unavailable when the hub's ManagedCluster watch is failing (the hub is unreachable)."""
        self._require_synced()
        clusters = self._caches.clusters
        if not clusters.healthy:
            raise Unavailable(
                f"hub {self._caches.name} unreachable ({clusters.last_error}); retry with backoff"
            )
