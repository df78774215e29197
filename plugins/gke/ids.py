"""Names of GKE and compute resources: cluster ids, operation names, target links, group URLs."""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "ClusterRef",
    "OperationRef",
    "Target",
    "group_key",
    "parse_cluster_id",
    "parse_operation_id",
    "parse_target",
    "parse_target_link",
]

_CLUSTER_ID = re.compile(r"^projects/([^/]+)/locations/([^/]+)/clusters/([^/]+)$")
_OPERATION_ID = re.compile(r"^projects/([^/]+)/locations/([^/]+)/operations/([^/]+)$")
# GKE's targetLink: .../projects/{id or number}/{zones|locations}/L/clusters/C[/nodePools/NP
# [/node/N]]; node-level links are what auto-repair operations point at (container v1
# Operation.target_link: "Server-defined URI for the target of the operation").
_TARGET = re.compile(
    r"/projects/([^/]+)/(?:zones|locations)/([^/]+)/clusters/([^/]+)"
    r"(?:/nodePools/([^/]+)(?:/nodes?/([^/]+))?)?/?$"
)
_GROUP = re.compile(r"(projects/[^/]+/(?:zones|regions|global)/.+)$")


class ClusterRef(NamedTuple):
    """A GKE cluster: project, location (region or zone) and name."""

    project: str
    location: str
    name: str

    @property
    def id(self) -> str:
        """projects/P/locations/L/clusters/C: the plugin's cluster id and GKE's resource name."""
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"

    @property
    def parent(self) -> str:
        """projects/P/locations/L."""
        return f"projects/{self.project}/locations/{self.location}"

    def pool(self, name: str) -> str:
        """The resource name of one of its node pools."""
        return f"{self.id}/nodePools/{name}"


class Target(NamedTuple):
    """What an operation's targetLink points at: a cluster, one of its pools, or one node."""

    location: str
    cluster: str
    node_pool: str  # "" for the cluster itself
    node: str  # "" unless the link names one node (repairs)


class OperationRef(NamedTuple):
    """A GKE operation: project, location and the operation's short name."""

    project: str
    location: str
    name: str

    @property
    def id(self) -> str:
        """projects/P/locations/L/operations/OP: the contract operation id of a GKE operation."""
        return f"projects/{self.project}/locations/{self.location}/operations/{self.name}"


def parse_cluster_id(cluster_id: str) -> ClusterRef | None:
    """The ClusterRef of projects/P/locations/L/clusters/C; None for anything else."""
    match = _CLUSTER_ID.match(cluster_id)
    return ClusterRef(*match.groups()) if match else None


def parse_operation_id(operation_id: str) -> OperationRef | None:
    """The OperationRef of projects/P/locations/L/operations/OP; None for anything else."""
    match = _OPERATION_ID.match(operation_id)
    return OperationRef(*match.groups()) if match else None


def parse_target(link: str) -> Target | None:
    """The cluster, node pool and node an operation's targetLink points at; None otherwise.

    The project part is left out: GKE writes project numbers in links, the plugin's ids carry
    project ids, and the caller already knows the project it listed.
    """
    match = _TARGET.search(link)
    if not match:
        return None
    _, location, cluster, pool, node = match.groups()
    return Target(location, cluster, pool or "", node or "")


def parse_target_link(link: str) -> tuple[str, str, str] | None:
    """(location, cluster, node pool or "") an operation's targetLink points at."""
    target = parse_target(link)
    return None if target is None else (target.location, target.cluster, target.node_pool)


def group_key(url: str) -> str:
    """A backend group URL reduced to projects/P/(zones|regions)/X/KIND/NAME for comparison.

    Compute answers full URLs (https://www.googleapis.com/compute/v1/projects/...), users
    often write the short form; both compare equal after this.
    """
    match = _GROUP.search(url.strip())
    return match.group(1).rstrip("/") if match else url.strip()
