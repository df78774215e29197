"""Which ARM operation serves which contract operation, kept beside the operation journal.

The SDK's OperationStore journals the contract operations (request_id → operation, states);
what ARM needs to follow an operation after a restart is the poller's continuation token
(azure-core's LROPoller.continuation_token(): the initial response's status, the
Azure-AsyncOperation / Location headers and body; never the Authorization header, which
azure-core filters out). This file maps each in-flight operation id to it, rewritten atomically
on every change; an operation whose token is missing (the plugin stopped between ARM's answer
and this write) is followed by its resource's provisioningState instead.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ArmOperation", "ArmOperations"]

_LOG = logging.getLogger("plugins.aks.operations")
_FORMAT = 1


@dataclass(frozen=True)
class ArmOperation:
    """One ARM long-running operation: what it changes and how to resume its poller."""

    cluster_id: str
    kind: str  # "cluster" (control plane), "pool" (orchestratorVersion) or "nodeImage"
    pool: str
    target: str
    token: str = ""


class ArmOperations:
    """ARM operations by contract operation id, in memory and (with a path) on disk."""

    def __init__(self, path: str = "") -> None:
        self._path = Path(path) if path else None
        self._lock = threading.Lock()
        self._ops: dict[str, ArmOperation] = {}
        if self._path is not None:
            self._load(self._path)

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        try:
            data = json.loads(text)
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            self._ops = {k: ArmOperation(**v) for k, v in data["operations"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(
                f"operations.stateFile: {str(path)!r} is not an ARM operation map of this "
                f"plugin ({exc}); move it away to start afresh"
            ) from None

    def _save_locked(self) -> None:
        if self._path is None:
            return
        data = {"format": _FORMAT, "operations": {k: asdict(v) for k, v in self._ops.items()}}
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".arm-", dir=self._path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, separators=(",", ":"))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self._path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            _LOG.error(
                "cannot write the ARM operation map; a restart follows these operations by "
                "their resources",
                extra={"fields": {"path": str(self._path), "error": exc.strerror}},
            )

    def put(self, op_id: str, operation: ArmOperation) -> None:
        with self._lock:
            self._ops[op_id] = operation
            self._save_locked()

    def get(self, op_id: str) -> ArmOperation | None:
        with self._lock:
            return self._ops.get(op_id)

    def drop(self, op_id: str) -> None:
        with self._lock:
            if self._ops.pop(op_id, None) is not None:
                self._save_locked()
