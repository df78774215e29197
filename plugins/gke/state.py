"""The plugin's small persistent memory: request_id bindings, its own operations, drained clusters.

GKE keeps its operations, so a restarted plugin can always read them; what GKE cannot tell is
which caller request started which operation, and what the plugin did by itself (service-out in
mode none, requests that had nothing to do). That is kept here, in memory and, when
operations.stateFile is set, in a JSON file rewritten atomically on every change.
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

from google.protobuf import json_format

from fleetupgrade.plugin.v1 import cluster_pb2

__all__ = ["Binding", "PluginState"]

_LOG = logging.getLogger("plugins.gke.state")
_FORMAT = 1
_MAX_ENTRIES = 10000  # oldest bindings and operations are forgotten beyond this


@dataclass(frozen=True)
class Binding:
    """What a request_id asked for and the operation that serves it."""

    op_id: str
    kind: int
    cluster_id: str
    node_pool: str
    version: str
    adopted: bool = False  # an in-flight GKE operation found, not started by this request
    requested: str = ""  # the version as asked when it was an alias ("1.29", "latest")


class PluginState:
    """Bindings by request_id (and by operation id), local operations, drained clusters."""

    def __init__(self, path: str = "") -> None:
        self._path = Path(path) if path else None
        self._lock = threading.Lock()
        self._requests: dict[str, Binding] = {}
        self._by_op: dict[str, str] = {}
        self._ops: dict[str, cluster_pb2.Operation] = {}
        self._out: set[str] = set()
        if self._path is not None:
            self._load(self._path)

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ValueError(
                f"operations.stateFile: cannot read {str(path)!r} ({exc.strerror})"
            ) from None
        try:
            data = json.loads(text)
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            for request_id, raw in data.get("requests", {}).items():
                binding = Binding(**raw)
                self._requests[request_id] = binding
                self._by_op[binding.op_id] = request_id
            for raw in data.get("operations", []):
                op = json_format.ParseDict(raw, cluster_pb2.Operation())
                self._ops[op.id] = op
            self._out = set(data.get("outOfService", []))
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            raise ValueError(
                f"operations.stateFile: {str(path)!r} is not a state file of this plugin "
                f"({exc}); move it away to start afresh"
            ) from None
        _LOG.info(
            "state loaded",
            extra={
                "fields": {
                    "path": str(path),
                    "requests": len(self._requests),
                    "operations": len(self._ops),
                }
            },
        )

    def _save_locked(self) -> None:
        if self._path is None:
            return
        while len(self._requests) > _MAX_ENTRIES:
            oldest = next(iter(self._requests))
            self._by_op.pop(self._requests.pop(oldest).op_id, None)
        while len(self._ops) > _MAX_ENTRIES:
            del self._ops[next(iter(self._ops))]
        data: dict[str, Any] = {
            "format": _FORMAT,
            "requests": {rid: asdict(b) for rid, b in self._requests.items()},
            "operations": [json_format.MessageToDict(op) for op in self._ops.values()],
            "outOfService": sorted(self._out),
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self._path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, separators=(",", ":"))
            os.replace(tmp, self._path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)
            _LOG.exception("cannot write the state file; keeping the state in memory")

    # ------------------------------------------------------------------ bindings

    def bind(self, request_id: str, binding: Binding) -> None:
        """Remembers that request_id is served by binding.op_id."""
        with self._lock:
            self._requests[request_id] = binding
            self._by_op[binding.op_id] = request_id
            self._save_locked()

    def binding(self, request_id: str) -> Binding | None:
        """The binding of a request_id, if any."""
        with self._lock:
            return self._requests.get(request_id)

    def request_of(self, op_id: str) -> tuple[str, Binding] | None:
        """(request_id, binding) of an operation id, if a request is bound to it."""
        with self._lock:
            request_id = self._by_op.get(op_id)
            if request_id is None:
                return None
            return request_id, self._requests[request_id]

    # ---------------------------------------------------------- local operations

    def save_operation(self, op: cluster_pb2.Operation) -> None:
        """Keeps (a copy of) an operation the plugin runs itself."""
        with self._lock:
            clone = cluster_pb2.Operation()
            clone.CopyFrom(op)
            self._ops[op.id] = clone
            self._save_locked()

    def operations(self) -> list[cluster_pb2.Operation]:
        """Every kept local operation, oldest first."""
        with self._lock:
            return list(self._ops.values())

    # ------------------------------------------------------------- traffic: none

    def set_out_of_service(self, cluster_id: str, out: bool) -> None:
        """Records a cluster's service state (traffic mode none)."""
        with self._lock:
            if out:
                self._out.add(cluster_id)
            else:
                self._out.discard(cluster_id)
            self._save_locked()

    def out_of_service(self) -> frozenset[str]:
        """The clusters taken out of service (traffic mode none)."""
        with self._lock:
            return frozenset(self._out)
