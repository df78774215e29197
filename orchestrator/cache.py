"""A list+watch cache of one kind of ours across namespaces, kept current by our own writes too."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from orchestrator.kube import Gone, KubeClient

__all__ = ["ObjectCache"]

log = logging.getLogger(__name__)
Key = tuple[str, str]


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class ObjectCache:
    """Objects of one plural by (namespace, name), with an index by one label.

    `put` takes the object a write returned (write-through), so a reconcile that follows
    our own write never reads a stale copy; an older watch event never replaces a newer copy.
    """

    def __init__(
        self,
        kube: KubeClient,
        plural: str,
        namespace: str | None,
        index_label: str | None = None,
        on_change: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self._kube = kube
        self._plural = plural
        self._namespace = namespace
        self._label = index_label
        self._on_change = on_change
        self._objs: dict[Key, dict[str, Any]] = {}
        self._index: dict[tuple[str, str], set[Key]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def _index_key(self, obj: dict[str, Any]) -> tuple[str, str] | None:
        if self._label is None:
            return None
        value = (obj["metadata"].get("labels") or {}).get(self._label)
        return (obj["metadata"]["namespace"], value) if value else None

    def put(self, obj: dict[str, Any], deleted: bool = False) -> None:
        """Record an object (from a watch event or a write's answer)."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock:
            old = self._objs.get(key)
            if old is not None and _rv(old) > _rv(obj):
                return
            if old is not None:
                ik = self._index_key(old)
                if ik is not None:
                    self._index.get(ik, set()).discard(key)
            if deleted:
                self._objs.pop(key, None)
                return
            self._objs[key] = obj
            ik = self._index_key(obj)
            if ik is not None:
                self._index.setdefault(ik, set()).add(key)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""
        with self._lock:
            return self._objs.get((namespace, name))

    def by_label(self, namespace: str, value: str) -> list[dict[str, Any]]:
        """Objects whose index label has value, in one namespace."""
        with self._lock:
            return [self._objs[k] for k in self._index.get((namespace, value), set())]

    def items(self) -> list[dict[str, Any]]:
        """Every object."""
        with self._lock:
            return list(self._objs.values())

    def run(self, stop: threading.Event) -> None:
        """List, then watch until stop; re-list on 410 Gone or errors (with backoff)."""
        rv = ""
        delay = 0.5
        while not stop.is_set():
            try:
                if not rv:
                    items, rv = self._kube.list_objects(self._plural, self._namespace)
                    with self._lock:
                        self._objs.clear()
                        self._index.clear()
                    for obj in items:
                        self.put(obj)
                    self.synced.set()
                for event in self._kube.watch_objects(self._plural, self._namespace, rv, 60):
                    meta = event.obj.get("metadata", {})
                    rv = meta.get("resourceVersion", rv)
                    if event.type == "BOOKMARK":
                        continue
                    self.put(event.obj, deleted=event.type == "DELETED")
                    if self._on_change is not None:
                        self._on_change(event.type, event.obj)
                    if stop.is_set():
                        return
                delay = 0.5
            except Gone:
                rv = ""
            except Exception as err:  # keep watching through API outages
                log.warning("watch of %s failed: %s; retrying in %.1fs", self._plural, err, delay)
                rv = ""
                stop.wait(delay)
                delay = min(delay * 2, 30.0)
