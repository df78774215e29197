"""The bridge's durable memory of what it sent upstream: for each of our operations in flight,
the request and the upstream's (type, operationID) that serves it, in a JSON file rewritten
atomically (temp file, fsync, rename, directory fsync) on every change.

The operations themselves (request-id idempotency, GetOperation, watch revisions) live in the
SDK's OperationStore and its journal (--state FILE); this file sits next to it
(FILE.upstream) and holds what the original protocol cannot tell: which upstream operation is
ours, and which requests were about to be sent when the bridge stopped. A record is written
before the upstream is called and dropped when its operation ends. Without a path it lives in
memory only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from plugins.sdk import Unavailable

__all__ = ["SUFFIX", "Pending", "SentState", "UpstreamRef"]

_LOG = logging.getLogger("plugins.legacy.state")
_FORMAT = 1
_KIND = "fleet-plugin-legacy upstream operations"

SUFFIX = ".upstream"
"""Appended to the --state path to name this file."""


@dataclass(frozen=True)
class UpstreamRef:
    """What the upstream's mutating RPC returned: its operation type and id."""

    type: str
    operation_id: str


@dataclass(frozen=True)
class Pending:
    """One request sent (or about to be sent) upstream, and its answer once known."""

    request_id: str
    op_id: str
    kind: int
    cluster_id: str
    node_pool: str = ""
    version: str = ""
    upstream: UpstreamRef | None = None


class SentState:
    """Pending records by operation id; safe from any thread."""

    def __init__(self, path: str | None, upstream: str) -> None:
        self._path = Path(path) if path else None
        self._upstream = upstream
        self._lock = threading.Lock()
        self._records: dict[str, Pending] = {}
        if self._path is not None:
            self._load(self._path)

    @property
    def path(self) -> Path | None:
        """Where the records are written (None: memory only)."""
        return self._path

    def _load(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ValueError(
                f"--state: cannot use {str(path)!r} ({exc.strerror}); pass a path in a "
                "writable directory"
            ) from None
        try:
            data = json.loads(text)
            if data.get("kind") != _KIND or data.get("format") != _FORMAT:
                raise ValueError(f"kind {data.get('kind')!r} format {data.get('format')!r}")
            for raw in data["operations"]:
                ref = raw.pop("upstream", None)
                record = Pending(
                    **raw, upstream=UpstreamRef(ref["type"], ref["operation_id"]) if ref else None
                )
                self._records[record.op_id] = record
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(
                f"--state: {str(path)!r} is not a file of fleet-plugin-legacy ({exc}); move it "
                "away to start afresh (operations in flight are then not followed)"
            ) from None
        if data.get("upstream") != self._upstream:
            _LOG.warning(
                "the state was written for another upstream; its operations are followed there",
                extra={"fields": {"path": str(path), "was": data.get("upstream")}},
            )

    def get(self, op_id: str) -> Pending | None:
        """The record of one of our operations, if any."""
        with self._lock:
            return self._records.get(op_id)

    def all(self) -> list[Pending]:
        """Every record, oldest first."""
        with self._lock:
            return list(self._records.values())

    def put(self, record: Pending, *, must: bool = True) -> None:
        """Inserts or replaces a record and writes the file.

        must: raise Unavailable when the file cannot be written (and keep the old record);
        otherwise keep the new record in memory and log the failure.
        """
        with self._lock:
            old = self._records.get(record.op_id)
            self._records[record.op_id] = record
            try:
                self._save_locked()
            except Unavailable as exc:
                if not must:
                    _LOG.error("state not written; kept in memory: %s", exc.message)
                    return
                if old is None:
                    del self._records[record.op_id]
                else:
                    self._records[record.op_id] = old
                raise

    def drop(self, op_id: str) -> None:
        """Forgets a record (its operation ended, or the upstream refused the request)."""
        with self._lock:
            if self._records.pop(op_id, None) is None:
                return
            try:
                self._save_locked()
            except Unavailable as exc:
                _LOG.error("state not written; the record is forgotten in memory: %s", exc.message)

    def _save_locked(self) -> None:
        if self._path is None:
            return
        records: list[dict[str, Any]] = [asdict(r) for r in self._records.values()]
        data = {"kind": _KIND, "format": _FORMAT, "upstream": self._upstream, "operations": records}
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
        f"cannot write the state file {str(path)!r} ({exc.strerror}); nothing was sent to "
        "the upstream plugin; make the directory writable (or free space), then retry"
    )
