"""Watch caches of hub objects: list, then watch from the list's resourceVersion, re-list on 410."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from plugins.sdk.kube import Kube, KubeError, KubeGone, Resource

__all__ = ["CachedObject", "Informer"]

_LOG = logging.getLogger("plugins.ocm.cache")
_WATCH_SECONDS = 30
_BACKOFF_MIN = 0.2
_BACKOFF_MAX = 5.0

Key = tuple[str, str]


@dataclass(frozen=True)
class CachedObject:
    """An object as last seen, and when the watch delivered it."""

    obj: dict[str, Any]
    received: datetime


def _key_of(obj: dict[str, Any]) -> Key:
    """(namespace, name) of an object ("" namespace for cluster-scoped ones)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer:
    """Keeps every object of one resource (optionally label-selected) current in memory.

    A daemon thread lists, then watches; watch events update the store, a 410 (expired
    resourceVersion) re-lists, any other error backs off and re-lists. on_change runs after
    every change (from the informer's thread; keep it short).
    """

    def __init__(
        self,
        hub: Kube,
        resource: Resource,
        *,
        label_selector: str = "",
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._hub = hub
        self.resource = resource
        self._selector = label_selector
        self._on_change = on_change
        self._lock = threading.Lock()
        self._store: dict[Key, CachedObject] = {}
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._healthy = False
        self._last_error = ""
        self._thread = threading.Thread(
            target=self._run, name=f"ocm-informer-{resource.plural}", daemon=True
        )

    def start(self) -> None:
        """Starts the list-and-watch thread."""
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Asks the thread to end and waits up to timeout seconds (it is a daemon thread)."""
        self._stop.set()
        self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list has been stored."""
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        """True once the first list has been stored."""
        return self._synced.is_set()

    @property
    def healthy(self) -> bool:
        """True while the last list or watch call succeeded."""
        return self._healthy

    @property
    def last_error(self) -> str:
        """The last list/watch error, for Probe ("" when none)."""
        return self._last_error

    def get(self, namespace: str, name: str) -> CachedObject | None:
        """The cached object, or None."""
        with self._lock:
            return self._store.get((namespace, name))

    def items(self) -> list[CachedObject]:
        """Every cached object, ordered by (namespace, name)."""
        with self._lock:
            return [self._store[k] for k in sorted(self._store)]

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                _LOG.exception("informer change callback failed")

    def _run(self) -> None:
        backoff = _BACKOFF_MIN
        while not self._stop.is_set() and not self._hub.closed:
            try:
                version = self._relist()
                backoff = _BACKOFF_MIN
                while not self._stop.is_set():
                    version = self._watch_once(version)
            except KubeGone:
                continue
            except KubeError as exc:
                if self._stop.is_set() or self._hub.closed:
                    return
                self._healthy = False
                self._last_error = f"{self.resource}: {exc.message}"
                _LOG.warning(
                    "hub watch failed; listing again",
                    extra={"fields": {"resource": str(self.resource), "error": exc.message}},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
            except Exception:  # never let the thread die: the cache would silently go stale
                if self._stop.is_set() or self._hub.closed:
                    return
                self._healthy = False
                self._last_error = f"{self.resource}: unexpected error"
                _LOG.exception("informer failed; listing again")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)

    def _relist(self) -> str:
        items, version = self._hub.list(self.resource, self._selector)
        now = datetime.now(UTC)
        fresh = {_key_of(obj): CachedObject(obj, now) for obj in items}
        with self._lock:
            # Keep the receipt time of objects that did not change.
            for key, cached in fresh.items():
                old = self._store.get(key)
                if old is not None and _rv(old.obj) == _rv(cached.obj):
                    fresh[key] = old
            self._store = fresh
        self._healthy = True
        self._last_error = ""
        self._synced.set()
        self._changed()
        return version

    def _watch_once(self, version: str) -> str:
        for kind, obj in self._hub.watch(self.resource, version, self._selector, _WATCH_SECONDS):
            if self._stop.is_set():
                return version
            version = _rv(obj) or version
            if kind == "BOOKMARK":
                continue
            key = _key_of(obj)
            with self._lock:
                if kind == "DELETED":
                    self._store.pop(key, None)
                else:
                    self._store[key] = CachedObject(obj, datetime.now(UTC))
            self._healthy = True
            self._changed()
        return version


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
