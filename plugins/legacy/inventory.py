"""The bridge's inventory: the cluster ids it is told, read from the upstream's GetVersion and
GetClusterStatus and shown as the contract's Cluster (paged, in id order)."""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.legacy._gen import plugin_pb2
from plugins.legacy.upstream import Upstream, UpstreamError
from plugins.sdk import (
    NotFound,
    Reason,
    Unavailable,
    check_page_size,
    decode_page_token,
    encode_page_token,
)

__all__ = ["Inventory", "Observed", "load_clusters_file"]

_LOG = logging.getLogger("plugins.legacy.inventory")
_READ_WORKERS = 8  # upstream reads in parallel while listing a page
# Errors that mean the upstream itself cannot be reached: the whole listing fails then.
_TRANSPORT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)

InFlight = Callable[[str], cluster_pb2.Operation | None]
"""The cluster's PENDING or RUNNING operation, if any."""


@dataclass(frozen=True)
class Observed:
    """One cluster as the upstream reports it now."""

    version: plugin_pb2.ClusterVersion
    status: plugin_pb2.ClusterStatus

    @property
    def in_service(self) -> bool:
        return self.status.status == plugin_pb2.STATUS_SERVICE_IN

    def pool_version(self, node_pool: str) -> str | None:
        """The node pool's version; None when the cluster has no such pool."""
        for pool in self.version.nodePools:
            if pool.nodePoolID == node_pool:
                return pool.version
        return None


def load_clusters_file(path: str) -> dict[str, dict[str, str]]:
    """Cluster id → labels from a YAML file.

    Accepted shapes (several YAML documents may follow each other): a list of ids or of
    {id, labels} mappings; a mapping {clusters: [...]} of the same; or a ClusterVersion
    manifest of the original operator, whose spec.clusters[].id are taken.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as exc:
        raise ValueError(f"--clusters-file: cannot read {path!r} ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--clusters-file: {path!r} is not YAML ({exc})") from None
    clusters: dict[str, dict[str, str]] = {}
    for doc_index, document in enumerate(documents):
        entries: Any = document
        where = f"--clusters-file: {path!r} document {doc_index + 1}"
        if isinstance(document, dict):
            spec = document.get("spec")
            entries = spec.get("clusters") if isinstance(spec, dict) else document.get("clusters")
            where += ".spec.clusters" if isinstance(spec, dict) else ".clusters"
        if not isinstance(entries, list):
            raise ValueError(
                f"{where}: expected a list of cluster ids (or of {{id, labels}}), a mapping "
                "with `clusters:`, or a ClusterVersion manifest"
            )
        for index, entry in enumerate(entries):
            cluster_id, labels = _entry(entry, f"{where}[{index}]")
            clusters[cluster_id] = labels
    return clusters


def _entry(entry: Any, where: str) -> tuple[str, dict[str, str]]:
    if isinstance(entry, str) and entry:
        return entry, {}
    if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]:
        labels = entry.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ValueError(f"{where}.labels: must map strings to strings")
        return entry["id"], dict(labels)
    raise ValueError(f"{where}: must be a non-empty cluster id or a mapping with a non-empty id")


class Inventory:
    """The clusters the bridge serves, each read from the upstream when asked.

    A cluster the upstream fails to read while listing is shown from its last good reading
    as unavailable (with the reason), or left out when it was never read; an unreachable
    upstream fails the whole listing with UNAVAILABLE.
    """

    def __init__(
        self, clusters: Mapping[str, Mapping[str, str]], upstream: Upstream, in_flight: InFlight
    ) -> None:
        if not clusters:
            raise ValueError(
                "no clusters: pass --cluster ID (repeatable) or --clusters-file FILE with the "
                "ids the upstream plugin serves"
            )
        self._labels = {cid: dict(labels) for cid, labels in clusters.items()}
        self._ids = sorted(self._labels)
        self._upstream = upstream
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self._last: dict[str, Observed] = {}
        self._pool = futures.ThreadPoolExecutor(_READ_WORKERS, thread_name_prefix="legacy-read")

    @property
    def upstream(self) -> Upstream:
        """The upstream plugin the clusters are read from."""
        return self._upstream

    @property
    def ids(self) -> list[str]:
        """The cluster ids, sorted."""
        return list(self._ids)

    def require(self, cluster_id: str) -> None:
        """NotFound unless the bridge serves this cluster."""
        if cluster_id not in self._labels:
            raise NotFound(
                f"cluster {cluster_id} is not in the bridge's inventory; add it with --cluster "
                "or --clusters-file",
                reason=Reason.CLUSTER_NOT_FOUND,
            )

    def observe(self, cluster_id: str) -> Observed:
        """The cluster as the upstream reports it now; raises UpstreamError."""
        observed = Observed(
            self._upstream.get_version(cluster_id), self._upstream.get_cluster_status(cluster_id)
        )
        with self._lock:
            self._last[cluster_id] = observed
        return observed

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """GetCluster: NotFound outside the inventory; the upstream's error when it fails."""
        self.require(cluster_id)
        try:
            observed = self.observe(cluster_id)
        except UpstreamError as exc:
            raise exc.to_plugin_error(f"cluster {cluster_id}") from None
        return cluster_pb2.GetClusterResponse(cluster=self._cluster(cluster_id, observed, ""))

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the clusters whose labels include match_labels, by id."""
        size = check_page_size(page_size)
        after = decode_page_token(page_token)
        ids = [
            cid
            for cid in self._ids
            if all(self._labels[cid].get(k) == v for k, v in match_labels.items())
        ]
        rest = ids[bisect.bisect_right(ids, after) :] if after else ids
        page_ids = rest[:size]
        readings = list(self._pool.map(self._read, page_ids))
        transport = next((e for _, e in readings if e is not None and e.code in _TRANSPORT), None)
        if transport is not None:
            raise Unavailable(
                f"the upstream plugin at {transport.endpoint} is unreachable "
                f"({transport.rpc}: {transport.code.name}: {transport.details}); retry with "
                "backoff"
            )
        shown = [self._shown(cid, r) for cid, r in zip(page_ids, readings, strict=True)]
        clusters = [c for c in shown if c is not None]
        # total_size counts the clusters left out of this page (never read) as absent.
        return cluster_pb2.ListClustersResponse(
            clusters=clusters,
            next_page_token=encode_page_token(page_ids[-1]) if len(rest) > size else "",
            total_size=len(ids) - (len(shown) - len(clusters)),
        )

    def _read(self, cluster_id: str) -> tuple[Observed | None, UpstreamError | None]:
        try:
            return self.observe(cluster_id), None
        except UpstreamError as exc:
            return None, exc

    def _shown(
        self, cluster_id: str, reading: tuple[Observed | None, UpstreamError | None]
    ) -> cluster_pb2.Cluster | None:
        observed, error = reading
        if observed is not None:
            return self._cluster(cluster_id, observed, "")
        assert error is not None
        with self._lock:
            last = self._last.get(cluster_id)
        if last is None:
            _LOG.warning(
                "cluster left out of the listing: the upstream cannot read it",
                extra={"fields": {"cluster": cluster_id, "error": str(error)}},
            )
            return None
        reason = f"the upstream plugin cannot read it now ({error.rpc}: {error.code.name}: "
        reason += f"{error.details}); versions are from its last reading"
        return self._cluster(cluster_id, last, reason)

    def _cluster(self, cluster_id: str, observed: Observed, failure: str) -> cluster_pb2.Cluster:
        current = self._in_flight(cluster_id)
        upgrading = (
            current.node_pool
            if current is not None and current.kind == cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL
            else None
        )
        available = observed.status.isAvailable and not failure
        cluster = cluster_pb2.Cluster(
            id=cluster_id,
            labels=self._labels[cluster_id],
            control_plane_version=observed.version.master.version,
            node_pools=[
                cluster_pb2.NodePool(
                    name=pool.nodePoolID,
                    version=pool.version,
                    status=(
                        cluster_pb2.NODE_POOL_STATUS_UPGRADING
                        if pool.nodePoolID == upgrading
                        else cluster_pb2.NODE_POOL_STATUS_READY
                    ),
                )
                for pool in observed.version.nodePools
            ],
            available=available,
            unavailable_reason=(
                ""
                if available
                else failure or "the upstream plugin reports isAvailable=false for it"
            ),
            in_service=observed.in_service,
        )
        if current is not None:
            cluster.current_operation.CopyFrom(current)
        return cluster

    def close(self) -> None:
        """Stops the read workers."""
        self._pool.shutdown(wait=False, cancel_futures=True)
