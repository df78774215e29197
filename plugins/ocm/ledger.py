"""The operation ledger kept on each ManagedCluster, so operations survive a plugin restart.

Every operation this plugin starts on a cluster is recorded in the annotation
`fleetupgrade.io/operations` of its ManagedCluster on the hub: request id, operation id, kind,
target, state, times and error. A taint operation's record is written in the same conditional
patch as the taint itself, so the hub never shows one without the other. A restarted plugin
reads the ledgers back, so a repeated request_id answers the operation it started and
GetOperation still finds it. The ledger keeps the last LEDGER_SIZE operations per cluster.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm.objects import annotations_of

__all__ = [
    "ANNOTATION_OPERATIONS",
    "LEDGER_SIZE",
    "Record",
    "operation_id_for",
    "read_ledger",
    "with_record",
]

_LOG = logging.getLogger("plugins.ocm.ledger")

ANNOTATION_OPERATIONS = "fleetupgrade.io/operations"
"""The ManagedCluster annotation holding the ledger (a JSON list, oldest first)."""

LEDGER_SIZE = 16
"""Operations kept per cluster; an older request_id is forgotten after a restart."""

_MESSAGE_MAX = 300


def operation_id_for(request_id: str) -> str:
    """The operation id of a request: derived from the request_id, so stable across restarts."""
    return "ocm-" + hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:20]


_KINDS: dict[int, str] = {
    cluster_pb2.OPERATION_KIND_SERVICE_OUT: "ServiceOut",
    cluster_pb2.OPERATION_KIND_SERVICE_IN: "ServiceIn",
    cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE: "UpgradeControlPlane",
}
_STATES: dict[int, str] = {
    cluster_pb2.OPERATION_STATE_RUNNING: "Running",
    cluster_pb2.OPERATION_STATE_SUCCEEDED: "Succeeded",
    cluster_pb2.OPERATION_STATE_FAILED: "Failed",
}


@dataclass(frozen=True)
class Record:
    """One operation as the ledger keeps it (JSON field names are these, in camelCase)."""

    request_id: str
    operation_id: str
    kind: int
    state: int
    target_version: str = ""
    started: str = ""  # RFC 3339
    ended: str = ""
    error_code: str = ""
    error_message: str = ""

    @classmethod
    def of(cls, op: cluster_pb2.Operation) -> Record:
        """The record of an operation (times as RFC 3339, the message bounded)."""
        started = op.start_time.ToJsonString() if op.HasField("start_time") else ""
        ended = op.end_time.ToJsonString() if op.HasField("end_time") else ""
        return cls(
            request_id=op.request_id,
            operation_id=op.id,
            kind=op.kind,
            state=op.state if op.state in _STATES else cluster_pb2.OPERATION_STATE_RUNNING,
            target_version=op.target_version,
            started=started,
            ended=ended,
            error_code=op.error_code,
            error_message=op.error_message[:_MESSAGE_MAX],
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = _KINDS[self.kind]
        data["state"] = _STATES[self.state]
        return {_camel(k): v for k, v in data.items() if v != ""}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _from_json(item: Mapping[str, Any]) -> Record | None:
    kinds = {v: k for k, v in _KINDS.items()}
    states = {v: k for k, v in _STATES.items()}
    try:
        return Record(
            request_id=str(item["requestId"]),
            operation_id=str(item["operationId"]),
            kind=kinds[str(item["kind"])],
            state=states[str(item["state"])],
            target_version=str(item.get("targetVersion", "")),
            started=str(item.get("started", "")),
            ended=str(item.get("ended", "")),
            error_code=str(item.get("errorCode", "")),
            error_message=str(item.get("errorMessage", "")),
        )
    except (KeyError, TypeError):
        return None


def read_ledger(obj: Mapping[str, Any]) -> list[Record]:
    """The records on a ManagedCluster, oldest first; unreadable entries are skipped (logged)."""
    text = annotations_of(obj).get(ANNOTATION_OPERATIONS)
    if not text:
        return []
    try:
        items = json.loads(text)
    except ValueError:
        items = None
    if not isinstance(items, list):
        name = (obj.get("metadata") or {}).get("name")
        _LOG.warning(
            "unreadable operation ledger ignored",
            extra={"fields": {"cluster": name, "annotation": ANNOTATION_OPERATIONS}},
        )
        return []
    records = [_from_json(item) for item in items if isinstance(item, Mapping)]
    return [r for r in records if r is not None]


def with_record(obj: Mapping[str, Any], record: Record) -> str | None:
    """The ledger annotation's new value with record in (the same request's record replaced
    in place, a new one appended, the oldest dropped past LEDGER_SIZE); None when the ledger
    holds exactly that already."""
    records = read_ledger(obj)
    if record in records:
        return None
    same = [i for i, r in enumerate(records) if r.request_id == record.request_id]
    if same:
        records[same[0]] = record  # its new state, in its place
    else:
        records.append(record)
    return json.dumps([r.to_json() for r in records[-LEDGER_SIZE:]], separators=(",", ":"))
