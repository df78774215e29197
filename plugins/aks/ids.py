"""AKS cluster ids: the managed cluster's ARM resource id, in one canonical spelling.

ARM resource ids are case-insensitive (https://learn.microsoft.com/azure/azure-resource-manager/
management/resource-name-rules); the plugin spells them with ARM's segment names and the
subscription, resource group and cluster name in lower case, so one cluster has one id:
/subscriptions/SUB/resourceGroups/RG/providers/Microsoft.ContainerService/managedClusters/NAME.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ClusterRef", "parse_cluster_id"]

_ID = re.compile(
    r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/"
    r"Microsoft\.ContainerService/managedClusters/([^/]+)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ClusterRef:
    """One managed cluster: subscription, resource group, name (lower case)."""

    subscription: str
    group: str
    name: str

    @property
    def id(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/"
            f"Microsoft.ContainerService/managedClusters/{self.name}"
        )


def parse_cluster_id(cluster_id: str) -> ClusterRef | None:
    """The cluster a resource id names (any case), or None when it is not one."""
    match = _ID.match(cluster_id.strip())
    if match is None:
        return None
    subscription, group, name = (part.lower() for part in match.groups())
    return ClusterRef(subscription, group, name)
