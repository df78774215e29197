"""GKE operations seen through the contract: status mapping, progress, and an OperationStore that
mirrors operations GKE owns next to the ones the plugin runs itself."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from google.cloud import container_v1
from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.ids import OperationRef, parse_target
from plugins.sdk import TERMINAL_STATES, OperationStore

__all__ = [
    "ADOPTABLE_TYPES",
    "KIND_BY_TYPE",
    "GkeOperationStore",
    "Mirrored",
    "blocks",
    "by_start",
    "contract_state",
    "describe",
    "progress_percent",
]

_Type = container_v1.Operation.Type
_Status = container_v1.Operation.Status

KIND_BY_TYPE: dict[int, int] = {
    _Type.UPGRADE_MASTER: cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
    _Type.UPGRADE_NODES: cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL,
    # google/container/v1 cluster_service.proto, Operation.Type: UPDATE_CLUSTER is "a broad
    # category" that some GKE-initiated control-plane upgrades use (and AUTO_UPGRADE_NODES is
    # "Unused. Automatic node upgrade uses UPGRADE_NODES"). It is followed and shown as the
    # cluster's current control-plane operation, but never adopted while it runs (it carries
    # no version and may change metadata only): see ADOPTABLE_TYPES.
    _Type.UPDATE_CLUSTER: cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
}
"""GKE operation types the contract reports (others still keep a cluster busy)."""

ADOPTABLE_TYPES = frozenset({"UPGRADE_MASTER", "UPGRADE_NODES"})
"""Types whose in-flight operation may serve a request of the same kind and target."""

_CONCURRENT_TYPES = frozenset({"AUTO_REPAIR_NODES", "SET_NODE_POOL_MANAGEMENT"})
"""cluster_service.proto, Operation.Type: AUTO_REPAIR_NODES "may be concurrent with other
operations"; SET_NODE_POOL_MANAGEMENT "only update[s] metadata and may be concurrent with most
other operations"."""


def blocks(info: Mirrored, node_pools: Iterable[str]) -> bool:
    """Whether an operation in flight keeps an upgrade (of the control plane and/or those node
    pools) from starting. GKE runs one cluster operation at a time, except the concurrent
    types: a node auto-repair holds back only an upgrade of its own pool (the plugin's choice:
    its nodes are being recreated), a management update nothing."""
    if info.type_name == "AUTO_REPAIR_NODES":
        return info.node_pool in set(node_pools)
    return info.type_name not in _CONCURRENT_TYPES


_CODE_CANCELLED = 1  # google.rpc.Code


class Mirrored(NamedTuple):
    """What a GKE operation says, independent of who asked for it."""

    op_id: str
    location: str
    cluster: str
    node_pool: str
    kind: int  # 0 when the type is not one the contract reports
    type_name: str
    in_flight: bool
    node: str = ""  # the node a node-level operation (an auto-repair) works on

    @property
    def what(self) -> str:
        """The operation for people: "UPGRADE_NODES of pool NP", "AUTO_REPAIR_NODES of node N"."""
        name = self.type_name or "operation"
        if self.node:
            return f"{name} of node {self.node} in pool {self.node_pool}"
        if self.node_pool:
            return f"{name} of pool {self.node_pool}"
        return name


def describe(op: container_v1.Operation, project: str) -> Mirrored | None:
    """The GKE operation's id, target and kind; None when its target is not a cluster."""
    target = parse_target(op.target_link)
    if target is None:
        return None
    op_id = OperationRef(project, op.location or op.zone or target.location, op.name).id
    type_value = int(op.operation_type)
    kind = KIND_BY_TYPE.get(type_value, 0)
    if target.node:
        kind = 0  # a node-level operation (a repair) is not a pool upgrade of the contract
    return Mirrored(
        op_id=op_id,
        location=target.location,
        cluster=target.cluster,
        node_pool=target.node_pool,
        kind=kind,
        type_name=_Type(type_value).name if type_value in _Type._value2member_map_ else "",
        in_flight=op.status != _Status.DONE,
        node=target.node,
    )


def by_start(ops: list[container_v1.Operation]) -> list[container_v1.Operation]:
    """Operations oldest first by startTime (ListOperations documents no order)."""
    return sorted(ops, key=lambda op: (_instant(op.start_time), op.name))


def _instant(text: str) -> tuple[int, int]:
    """(seconds, nanos) of an RFC 3339 time; (0, 0) when empty or unreadable."""
    stamp = timestamp_pb2.Timestamp()
    try:
        stamp.FromJsonString(text)
    except ValueError:
        return 0, 0
    return stamp.seconds, stamp.nanos


def progress_percent(op: container_v1.Operation) -> int:
    """0..100 from GKE's progress metrics ("nodes done"/"nodes total", "progress"/"progress
    scale", or "percent done"); 0 when GKE reports none."""
    metrics: dict[str, float] = {}
    for metric in op.progress.metrics:
        name = metric.name.strip().lower().replace("_", " ")
        if "int_value" in metric:
            metrics[name] = float(metric.int_value)
        elif "double_value" in metric:
            metrics[name] = float(metric.double_value)
    if metrics.get("nodes total"):
        return _bounded(100 * metrics.get("nodes done", 0.0) / metrics["nodes total"])
    if "progress" in metrics:
        scale = metrics.get("progress scale") or 1.0
        return _bounded(100 * metrics["progress"] / scale)
    if "percent done" in metrics:
        return _bounded(metrics["percent done"])
    return 0


def _bounded(value: float) -> int:
    return max(0, min(100, int(value)))


def contract_state(op: container_v1.Operation, op_id: str = "") -> tuple[int, str, str]:
    """(state, error_code, error_message): PENDING → PENDING; RUNNING and ABORTING → RUNNING;
    DONE → SUCCEEDED, or FAILED when GKE reports an error (the message names op_id)."""
    status = op.status
    if status in (_Status.PENDING, _Status.STATUS_UNSPECIFIED):
        return cluster_pb2.OPERATION_STATE_PENDING, "", ""
    if status != _Status.DONE:
        return cluster_pb2.OPERATION_STATE_RUNNING, "", ""
    message = op.error.message or op.status_message
    if op.error.code == 0 and not message:
        return cluster_pb2.OPERATION_STATE_SUCCEEDED, "", ""
    code = "CANCELLED" if op.error.code == _CODE_CANCELLED else "UPGRADE_FAILED"
    text = f"GKE operation {op_id or op.name} failed: {message or f'error code {op.error.code}'}"
    return cluster_pb2.OPERATION_STATE_FAILED, code, text


def _copy(op: cluster_pb2.Operation) -> cluster_pb2.Operation:
    clone = cluster_pb2.Operation()
    clone.CopyFrom(op)
    return clone


def timestamp(text: str) -> timestamp_pb2.Timestamp:
    """An RFC 3339 time of GKE as a Timestamp (now when empty or unreadable)."""
    stamp = timestamp_pb2.Timestamp()
    if text:
        try:
            stamp.FromJsonString(text)
            return stamp
        except ValueError:
            pass
    stamp.GetCurrentTime()
    return stamp


class GkeOperationStore(OperationStore):
    """An OperationStore that also mirrors operations GKE runs (upgrades, auto-upgrades).

    record() inserts or refreshes a mirrored operation and publishes it to watchers when it
    changed; bind() attaches a request_id to an operation found in GKE. The SDK's rules hold
    for both kinds: one in flight per cluster, terminal operations never change.
    """

    def record(self, op: cluster_pb2.Operation) -> cluster_pb2.Operation:
        """Stores the operation as GKE reports it now; returns the stored state.

        Known fields that GKE cannot tell (request_id, target_version) are kept. An operation
        first seen already terminal is stored silently (history, not news).
        """
        with self._lock:
            old = self._ops.get(op.id)
            if old is not None and old.state in TERMINAL_STATES:
                return _copy(old)
            new = _copy(op)
            if old is not None:
                new.request_id = new.request_id or old.request_id
                new.target_version = new.target_version or old.target_version
                if old.HasField("start_time"):
                    new.start_time.CopyFrom(old.start_time)
                if new == old:
                    return _copy(old)
            self._ops[new.id] = new
            if new.request_id:
                self._by_request.setdefault(new.request_id, new.id)
            if new.state in TERMINAL_STATES:
                if not new.HasField("end_time"):
                    new.end_time.GetCurrentTime()
                if new.state == cluster_pb2.OPERATION_STATE_SUCCEEDED:
                    new.progress_percent = 100
                if self._in_flight.get(new.cluster_id) == new.id:
                    del self._in_flight[new.cluster_id]
                if old is None:
                    return _copy(new)
            else:
                self._in_flight[new.cluster_id] = new.id
            return self._publish_locked(new)

    def bind(self, request_id: str, op_id: str, target_version: str) -> cluster_pb2.Operation:
        """Makes request_id name the stored operation op_id (filling its empty request_id and
        target_version); returns the operation."""
        with self._lock:
            op = self._ops[op_id]
            if not op.request_id:
                op.request_id = request_id
            if not op.target_version:
                op.target_version = target_version
            self._by_request[request_id] = op_id
            return _copy(op)

    def known(self, op_id: str) -> cluster_pb2.Operation | None:
        """The stored operation with this id, if any."""
        with self._lock:
            op = self._ops.get(op_id)
            return None if op is None else _copy(op)

    def in_flight_ids(self) -> list[str]:
        """Ids of every PENDING or RUNNING operation."""
        with self._lock:
            return list(self._in_flight.values())
