"""Names of EKS things in the contract: cluster ids (cluster ARNs), operation ids (an EKS
update of a cluster or a node group), and the clientRequestToken of a request_id."""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

__all__ = ["ClusterRef", "UpdateRef", "client_token", "parse_cluster_id", "parse_operation_id"]

# arn:PARTITION:eks:REGION:ACCOUNT:cluster/NAME (DescribeCluster's Cluster.arn).
_ARN = re.compile(r"^arn:(aws[a-z-]*):eks:([a-z0-9-]+):(\d{12}):cluster/([0-9A-Za-z][\w-]*)$")
_OP = re.compile(r"^(arn:[^/]+/[^/]+)(?:/nodegroups/([^/]+))?/updates/([0-9A-Za-z-]+)$")


class ClusterRef(NamedTuple):
    """An EKS cluster: partition, region, account and name."""

    partition: str
    region: str
    account: str
    name: str

    @property
    def id(self) -> str:
        """The cluster's ARN: the plugin's cluster id."""
        return f"arn:{self.partition}:eks:{self.region}:{self.account}:cluster/{self.name}"


class UpdateRef(NamedTuple):
    """An EKS update (DescribeUpdate's name, nodegroupName and updateId)."""

    cluster: ClusterRef
    nodegroup: str
    update_id: str

    @property
    def id(self) -> str:
        """<cluster ARN>[/nodegroups/NG]/updates/ID: the contract operation id."""
        middle = f"/nodegroups/{self.nodegroup}" if self.nodegroup else ""
        return f"{self.cluster.id}{middle}/updates/{self.update_id}"


def parse_cluster_id(cluster_id: str) -> ClusterRef | None:
    """The ClusterRef of a cluster ARN; None for anything else."""
    match = _ARN.match(cluster_id)
    return ClusterRef(*match.groups()) if match else None


def parse_operation_id(op_id: str) -> UpdateRef | None:
    """The UpdateRef of an operation id this plugin gave out for an EKS update; None else."""
    match = _OP.match(op_id)
    if not match:
        return None
    cluster = parse_cluster_id(match.group(1))
    if cluster is None:
        return None
    return UpdateRef(cluster, match.group(2) or "", match.group(3))


def client_token(request_id: str) -> str:
    """The clientRequestToken of a request_id (EKS's idempotency token): a digest, so the
    token is short and the same request_id always sends the same token, in every process."""
    return "fu-" + hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:40]
