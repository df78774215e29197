"""The OCM hub: its custom resources and a connection to it (the SDK's Kube client)."""

from __future__ import annotations

from plugins.sdk import Kube, Resource

__all__ = [
    "CLUSTER_CURATORS",
    "HOSTED_CLUSTERS",
    "MANAGED_CLUSTERS",
    "MANAGED_CLUSTER_INFOS",
    "MANIFEST_WORKS",
    "PLACEMENTS",
    "PLACEMENT_DECISIONS",
    "connect",
]


MANAGED_CLUSTERS = Resource(
    "cluster.open-cluster-management.io", "v1", "managedclusters", "ManagedCluster", False
)
"""ManagedCluster (cluster-scoped; name = cluster name = its namespace on the hub)."""

CLUSTER_CURATORS = Resource(
    "cluster.open-cluster-management.io", "v1beta1", "clustercurators", "ClusterCurator", True
)
"""ClusterCurator (stolostron; namespaced, by convention named after the cluster)."""

HOSTED_CLUSTERS = Resource(
    "hypershift.openshift.io", "v1beta1", "hostedclusters", "HostedCluster", True
)
"""HyperShift HostedCluster (on the hub when it hosts control planes; absent elsewhere)."""

MANIFEST_WORKS = Resource(
    "work.open-cluster-management.io", "v1", "manifestworks", "ManifestWork", True
)
"""ManifestWork (in the cluster's namespace on the hub)."""

PLACEMENTS = Resource(
    "cluster.open-cluster-management.io", "v1beta1", "placements", "Placement", True
)
"""Placement (namespaced): which clusters a workload goes to; its tolerations."""

PLACEMENT_DECISIONS = Resource(
    "cluster.open-cluster-management.io",
    "v1beta1",
    "placementdecisions",
    "PlacementDecision",
    True,
)
"""PlacementDecision (namespaced, labelled with its Placement): the clusters it selected."""

MANAGED_CLUSTER_INFOS = Resource(
    "internal.open-cluster-management.io",
    "v1beta1",
    "managedclusterinfos",
    "ManagedClusterInfo",
    True,
)
"""ManagedClusterInfo (ACM's foundation; in the cluster namespace, named after the cluster)."""


def connect(kubeconfig: str | None = None, name: str = "", flag: str = "--kubeconfig") -> Kube:
    """A client of an OCM hub (kubeconfig; default: in-cluster, then ~/.kube/config).

    name: the hub's name in messages ("hub" when there is one); flag: where the kubeconfig
    was given (configuration errors name it).
    """
    label = f"hub {name}" if name else "hub"
    return Kube(
        kubeconfig,
        what=label,
        flag=flag,
        fix=f"pass a readable kubeconfig of the OCM {label}",
        label=label,
    )
