"""The bridge's durable memory: each of our operations with the upstream's (type, operationID)
that serves it, in a JSON file rewritten atomically (temp file, fsync, rename) on every change.

The original plugin protocol has no request ids, so the upstream cannot tell a repeated request
from a new one; this file is what makes the same request_id return the same operation after
the bridge restarts. Without a path the state lives in memory only (no DURABLE_OPERATIONS).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.errors import Unavailable
from plugins.sdk.operations import TERMINAL_STATES

__all__ = ["MAX_FINISHED", "BridgeState", "Record", "UpstreamRef"]

_LOG = logging.getLogger("plugins.legacy.state")
_FORMAT = 1
_KIND = "fleet-plugin-legacy state"

MAX_FINISHED = 10_000
"""Finished operations kept (oldest forgotten first); operations in flight are always kept."""


@dataclass(frozen=True)
class UpstreamRef:
    """What the upstream's mutating RPC returned: its operation type and id."""

    type: str
    operation_id: str


@dataclass(frozen=True)
class Record:
    """One of our operations and the upstream operation behind it (None: not known)."""

    operation: cluster_pb2.Operation
    upstream: UpstreamRef | None


def _copy(op: cluster_pb2.Operation) -> cluster_pb2.Operation:
    clone = cluster_pb2.Operation()
    clone.CopyFrom(op)
    return clone


class BridgeState:
    """Records by operation id, in insertion order; safe from any thread."""

    def __init__(self, path: str | None, upstream: str) -> None:
        self._path = Path(path) if path else None
        self._upstream = upstream
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}
        if self._path is not None:
            self._load(self._path)

    @property
    def durable(self) -> bool:
        """True when the records survive a restart (a state file is set)."""
        return self._path is not None

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._check_writable(path)
            return
        except OSError as exc:
            raise ValueError(f"--state: cannot read {str(path)!r} ({exc.strerror})") from None
        try:
            data = json.loads(text)
            if data.get("kind") != _KIND or data.get("format") != _FORMAT:
                raise ValueError(f"kind {data.get('kind')!r} format {data.get('format')!r}")
            for raw in data["operations"]:
                op = json_format.ParseDict(raw["operation"], cluster_pb2.Operation())
                ref = raw.get("upstream")
                upstream = UpstreamRef(ref["type"], ref["operationID"]) if ref else None
                self._records[op.id] = Record(op, upstream)
        except (ValueError, TypeError, KeyError, AttributeError, json_format.ParseError) as exc:
            raise ValueError(
                f"--state: {str(path)!r} is not a state file of fleet-plugin-legacy ({exc}); "
                "move it away to start afresh (request ids it held are then forgotten)"
            ) from None
        if data.get("upstream") != self._upstream:
            _LOG.warning(
                "state file was written for another upstream; its operation ids are kept",
                extra={"fields": {"path": str(path), "was": data.get("upstream")}},
            )
        _LOG.info(
            "state loaded", extra={"fields": {"path": str(path), "operations": len(self._records)}}
        )

    @staticmethod
    def _check_writable(path: Path) -> None:
        directory = path.parent
        if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
            raise ValueError(
                f"--state: cannot create {str(path)!r}: its directory is missing or not "
                "writable; create it or pass another path"
            )

    def records(self) -> list[Record]:
        """Every record, oldest first (copies)."""
        with self._lock:
            return [Record(_copy(r.operation), r.upstream) for r in self._records.values()]

    def upstream_of(self, op_id: str) -> UpstreamRef | None:
        """The upstream operation behind one of ours, if known."""
        with self._lock:
            record = self._records.get(op_id)
            return None if record is None else record.upstream

    def put(self, op: cluster_pb2.Operation, upstream: UpstreamRef | None) -> None:
        """Inserts or replaces the record of op and writes the file.

        Unavailable when the file cannot be written: the caller must not act on the
        provider then, since a restart would forget the request.
        """
        with self._lock:
            old = self._records.get(op.id)
            self._records[op.id] = Record(_copy(op), upstream or (old.upstream if old else None))
            try:
                self._save_locked()
            except Unavailable:
                if old is None:
                    del self._records[op.id]
                else:
                    self._records[op.id] = old
                raise

    def drop(self, op_id: str) -> None:
        """Forgets a record (a request the upstream refused: a retry may start afresh)."""
        with self._lock:
            if self._records.pop(op_id, None) is not None:
                self._save_locked()

    def _save_locked(self) -> None:
        finished = [k for k, r in self._records.items() if r.operation.state in TERMINAL_STATES]
        for op_id in finished[: max(0, len(finished) - MAX_FINISHED)]:
            del self._records[op_id]
        if self._path is None:
            return
        data: dict[str, Any] = {
            "kind": _KIND,
            "format": _FORMAT,
            "upstream": self._upstream,
            "operations": [
                {
                    "operation": json_format.MessageToDict(r.operation),
                    "upstream": (
                        {"type": r.upstream.type, "operationID": r.upstream.operation_id}
                        if r.upstream
                        else None
                    ),
                }
                for r in self._records.values()
            ],
        }
        _write_atomically(self._path, json.dumps(data, separators=(",", ":")))


def _write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename over path, fsync the directory."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(path, exc) from None


def _unwritable(path: Path, exc: OSError) -> Unavailable:
    return Unavailable(
        f"cannot write the state file {str(path)!r} ({exc.strerror}); the change was not "
        "made; make the file's directory writable (or free space), then retry"
    )
