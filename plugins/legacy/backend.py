"""The SDK's ClusterBackend for the bridge: inventory reads and operations, side by side."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.legacy.inventory import Inventory
from plugins.legacy.operations import Ask, Operations

__all__ = ["LegacyBackend"]

_K = cluster_pb2.OperationKind


class LegacyBackend:
    """What the SDK's ClusterServicer asks, answered from the upstream through the bridge."""

    def __init__(self, inventory: Inventory, operations: Operations) -> None:
        self._inventory = inventory
        self._operations = operations

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str], /
    ) -> cluster_pb2.ListClustersResponse:
        return self._inventory.list_clusters(page_size, page_token, match_labels)

    def get_cluster(self, cluster_id: str, /) -> cluster_pb2.GetClusterResponse:
        return self._inventory.get_cluster(cluster_id)

    def service_out(
        self, request_id: str, cluster_id: str, caller: str, /
    ) -> cluster_pb2.Operation:
        return self._operations.mutate(request_id, Ask(_K.OPERATION_KIND_SERVICE_OUT, cluster_id))

    def service_in(self, request_id: str, cluster_id: str, caller: str, /) -> cluster_pb2.Operation:
        return self._operations.mutate(request_id, Ask(_K.OPERATION_KIND_SERVICE_IN, cluster_id))

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str, /
    ) -> cluster_pb2.Operation:
        ask = Ask(_K.OPERATION_KIND_UPGRADE_CONTROL_PLANE, cluster_id, version=version)
        return self._operations.mutate(request_id, ask)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str, /
    ) -> cluster_pb2.Operation:
        ask = Ask(_K.OPERATION_KIND_UPGRADE_NODE_POOL, cluster_id, node_pool, version)
        return self._operations.mutate(request_id, ask)

    def get_operation(self, operation_id: str, /) -> cluster_pb2.Operation:
        return self._operations.get(operation_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext, /
    ) -> Iterable[cluster_pb2.Operation]:
        return self._operations.watch(cluster_ids, include_in_flight, context)
