"""Service-out / service-in operations recorded on the MemberCluster (pure): what makes them and
their request ids survive a plugin restart.

The record is the annotation fleetupgrade.io/operations, a JSON list of the cluster's most recent
operations (oldest first, at most KEEP). It is written in the same conditional merge patch as the
taint change it describes, so the change and its request id are recorded together or not at
all; the end of an operation is written when the watch cache shows the taint in place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.kubefleet.objects import ANNOTATION_OPERATIONS

__all__ = ["KEEP", "OpRecord", "encode", "read", "with_record"]

KEEP = 10
"""Operations remembered per cluster: a request id older than that is new again (the caller
retries a request within minutes, never after ten later operations on the same cluster)."""

_KINDS = {
    cluster_pb2.OPERATION_KIND_SERVICE_OUT: "ServiceOut",
    cluster_pb2.OPERATION_KIND_SERVICE_IN: "ServiceIn",
}
_STATES = {
    cluster_pb2.OPERATION_STATE_RUNNING: "Running",
    cluster_pb2.OPERATION_STATE_SUCCEEDED: "Succeeded",
    cluster_pb2.OPERATION_STATE_FAILED: "Failed",
}


@dataclass(frozen=True)
class OpRecord:
    """One operation as recorded on the MemberCluster."""

    id: str
    requestId: str  # noqa: N815 (the JSON field name)
    kind: str
    state: str
    errorCode: str = ""  # noqa: N815
    errorMessage: str = ""  # noqa: N815

    @property
    def kind_value(self) -> int:
        """The contract's OperationKind."""
        return next(k for k, v in _KINDS.items() if v == self.kind)

    @property
    def state_value(self) -> int:
        """The contract's OperationState."""
        return next(k for k, v in _STATES.items() if v == self.state)

    @staticmethod
    def of(op: cluster_pb2.Operation) -> OpRecord:
        """The record of an operation."""
        return OpRecord(
            op.id,
            op.request_id,
            _KINDS[op.kind],
            _STATES.get(op.state, "Running"),
            op.error_code,
            op.error_message,
        )


def read(obj: Mapping[str, Any]) -> list[OpRecord]:
    """The records on a MemberCluster (malformed entries are skipped, never fatal)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_OPERATIONS)
    if not isinstance(text, str):
        return []
    try:
        items = json.loads(text)
    except ValueError:
        return []
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        try:
            record = OpRecord(
                str(item["id"]),
                str(item["requestId"]),
                str(item["kind"]),
                str(item["state"]),
                str(item.get("errorCode") or ""),
                str(item.get("errorMessage") or ""),
            )
        except KeyError:
            continue
        if record.kind in _KINDS.values() and record.state in _STATES.values():
            out.append(record)
    return out


def encode(records: Sequence[OpRecord]) -> str:
    """The annotation value (compact JSON, empty fields left out, the last KEEP records)."""
    kept = [{k: v for k, v in asdict(r).items() if v} for r in records[-KEEP:]]
    return json.dumps(kept, separators=(",", ":"), sort_keys=True)


def with_record(records: Sequence[OpRecord], record: OpRecord) -> list[OpRecord]:
    """records with this one added, or replacing the record of the same id."""
    out = [r for r in records if r.id != record.id]
    for index, old in enumerate(records):
        if old.id == record.id:
            out.insert(min(index, len(out)), replace(record))
            return out
    return [*out, record]
