"""The operation journal of a durable OperationStore: an append-only JSON-lines file, loaded at
start, compacted by atomic rewrite, held by one process at a time."""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from google.protobuf.message import DecodeError

from fleetupgrade.plugin.v1 import cluster_pb2

__all__ = ["OperationJournal"]

_LOG = logging.getLogger("plugins.sdk.journal")
_VERSION = 1
_MIN_COMPACT_LINES = 1_000


class OperationJournal:
    """One journal file: what the last process recorded, and appends for this one.

    Opening takes an advisory lock on "<path>.lock" (ValueError when another process holds
    it) and reads the file: `incarnation` (the highest the file names) and `loaded` (the last
    state of each operation not forgotten). A torn last line (the process died mid-write) is
    dropped; any other unreadable line is a ValueError naming the file and line. Write
    errors are OSError; the caller decides what they mean.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{self.path}.lock", "a", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise ValueError(
                f"state: {self.path} is in use by another process; give each plugin its own "
                "state file"
            ) from None
        try:
            self.incarnation, self.loaded = _read(self.path)
        except ValueError:
            lock.close()
            raise
        self._lock: IO[str] | None = lock
        self._file: IO[str] | None = None
        self._lines = 0

    def append(self, op: cluster_pb2.Operation, *, sync: bool) -> None:
        """Records op's state (sync: fsync before returning)."""
        self._write(_record(op), sync)

    def forget(self, op_id: str) -> None:
        """Records that the operation was dropped (fsynced)."""
        self._write(json.dumps({"forget": op_id}) + "\n", True)

    def needs_compaction(self, live: int) -> bool:
        """Whether the file grew past twice the live operations (and a floor of 1,000 lines)."""
        return self._lines > max(_MIN_COMPACT_LINES, 2 * live)

    def compact(self, incarnation: int, ops: Iterable[cluster_pb2.Operation]) -> None:
        """Rewrites the file as a header and one record per operation: a temporary file,
        fsync, rename over, fsync of the directory. The old file stays in use until the new
        one is complete, so a failure leaves a valid journal."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        count = 0
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(json.dumps({"version": _VERSION, "incarnation": incarnation}) + "\n")
            for op in ops:
                out.write(_record(op))
                count += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        if self._file is not None:
            self._file.close()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._lines = count

    def close(self) -> None:
        """Flushes, closes and releases the lock; later appends are dropped."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.flush()
                os.fsync(self._file.fileno())
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self._lock is not None:
            self._lock.close()  # releases the advisory lock
            self._lock = None

    def _write(self, line: str, sync: bool) -> None:
        if self._file is None:
            if self._lock is None:
                return  # closed
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(line)
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self._lines += 1


def _record(op: cluster_pb2.Operation) -> str:
    """One line: the operation as protobuf (base64), with its id, cluster and state readable
    beside it (for people; loading reads only "pb")."""
    entry = {
        "id": op.id,
        "cluster": op.cluster_id,
        "state": cluster_pb2.OperationState.Name(op.state),
        "pb": base64.b64encode(op.SerializeToString()).decode("ascii"),
    }
    return json.dumps(entry, separators=(",", ":")) + "\n"


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _read(path: Path) -> tuple[int, dict[str, cluster_pb2.Operation]]:
    """(highest incarnation named, last state of each operation); (0, {}) when absent."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0, {}
    except OSError as exc:
        raise ValueError(f"state: cannot read {path} ({exc.strerror})") from None
    incarnation = 0
    ops: dict[str, cluster_pb2.Operation] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry: Any = json.loads(line)
            if "pb" in entry:
                op = cluster_pb2.Operation.FromString(base64.b64decode(entry["pb"], validate=True))
                if not op.id:
                    raise ValueError("operation without id")
                ops[op.id] = op
            elif "forget" in entry:
                ops.pop(str(entry["forget"]), None)
            else:
                incarnation = max(incarnation, int(entry.get("incarnation", 0)))
        except (ValueError, TypeError, AttributeError, binascii.Error, DecodeError) as exc:
            if number == len(lines):
                _LOG.warning("dropping a torn last line of the operation journal %s", path)
                continue
            raise ValueError(
                f"state: {path}:{number} is not an operation journal record ({exc}); move the "
                "file aside to start with no operations"
            ) from None
    return incarnation, ops
