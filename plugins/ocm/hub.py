"""The OCM hub: its custom resources and a connection to it (the SDK's Kube client)."""

from __future__ import annotations

from plugins.sdk.kube import Kube, Resource

__all__ = ["CLUSTER_CURATORS", "MANAGED_CLUSTERS", "MANIFEST_WORKS", "connect"]


MANAGED_CLUSTERS = Resource(
    "cluster.open-cluster-management.io", "v1", "managedclusters", "ManagedCluster", False
)
"""ManagedCluster (cluster-scoped; name = cluster name = its namespace on the hub)."""

CLUSTER_CURATORS = Resource(
    "cluster.open-cluster-management.io", "v1beta1", "clustercurators", "ClusterCurator", True
)
"""ClusterCurator (stolostron; namespaced, by convention named after the cluster)."""

MANIFEST_WORKS = Resource(
    "work.open-cluster-management.io", "v1", "manifestworks", "ManifestWork", True
)
"""ManifestWork (in the cluster's namespace on the hub)."""


def connect(kubeconfig: str | None = None) -> Kube:
    """A client of the OCM hub (kubeconfig; default: in-cluster, then ~/.kube/config)."""
    return Kube(
        kubeconfig, what="hub", fix="pass a readable kubeconfig of the OCM hub", label="hub"
    )
