"""Watch caches of apiserver objects: list, watch from its resourceVersion, re-list on 410."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from plugins.sdk.errors import Unavailable
from plugins.sdk.kube import Kube, KubeError, KubeGone, Resource

__all__ = ["CachedObject", "Informer", "caches_readiness", "key_of", "require_listed"]

_LOG = logging.getLogger("plugins.sdk.kubecache")
_BACKOFF_MIN = 0.2
_ABSENT_STATUSES = (403, 404)  # an optional resource's API is not installed, or not granted

Key = tuple[str, str]


@dataclass(frozen=True)
class CachedObject:
    """An object as last seen, and when the watch delivered it."""

    obj: dict[str, Any]
    received: datetime


def key_of(obj: dict[str, Any]) -> Key:
    """(namespace, name) of an object ("" namespace for cluster-scoped ones)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer:
    """Keeps every object of one resource (optionally label-selected) current in memory.

    A daemon thread lists, then watches (watch_seconds a call); events update the store, a
    410 (expired resourceVersion) re-lists, any other error backs off (up to backoff_max
    seconds) and re-lists. on_change runs after every change and every failure, from the
    informer's thread (keep it short: set an event).

    optional: the resource's API may be absent from the server (a CRD not installed: 404) or
    not granted (403). Such an answer to the list is then a state, not a failure: the cache is
    listed, empty and healthy, `absent` says why, and the list is tried again every
    absent_retry seconds (the API may be installed later). Readiness does not wait on it.
    """

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        label_selector: str = "",
        on_change: Callable[[], None] | None = None,
        watch_seconds: int = 300,
        backoff_max: float = 10.0,
        optional: bool = False,
        absent_retry: float = 60.0,
    ) -> None:
        self._kube = kube
        self.resource = resource
        self._selector = label_selector
        self._on_change = on_change
        self._watch_seconds = watch_seconds
        self._backoff_max = backoff_max
        self._optional = optional
        self._absent_retry = absent_retry
        self._absent = ""
        self._lock = threading.Lock()
        self._store: dict[Key, CachedObject] = {}
        self._by_namespace: dict[str, dict[str, CachedObject]] = {}
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._healthy = False
        self._last_error = ""
        self._thread = threading.Thread(target=self._run, name=f"informer-{resource}", daemon=True)

    def start(self) -> None:
        """Starts the list-and-watch thread."""
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Asks the thread to end and waits up to timeout seconds (it is a daemon thread; a
        watch blocked in a long poll ends when its client is closed or the poll times out)."""
        self._stop.set()
        if timeout > 0 and self._thread.is_alive():
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

    @property
    def absent(self) -> str:
        """Why an optional resource is not served ("" while it is): the server's 404 or 403."""
        return self._absent

    def get(self, namespace: str, name: str) -> CachedObject | None:
        """The cached object, or None."""
        with self._lock:
            return self._store.get((namespace, name))

    def items(self) -> list[CachedObject]:
        """Every cached object, ordered by (namespace, name)."""
        with self._lock:
            return [self._store[k] for k in sorted(self._store)]

    def in_namespace(self, namespace: str) -> list[CachedObject]:
        """The cached objects of one namespace, ordered by name (an index: no scan)."""
        with self._lock:
            found = self._by_namespace.get(namespace) or {}
            return [found[name] for name in sorted(found)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                _LOG.exception("informer change callback failed")

    def _run(self) -> None:
        backoff = _BACKOFF_MIN
        while not self._stop.is_set() and not self._kube.closed:
            try:
                version = self._relist()
                backoff = _BACKOFF_MIN
                while not self._stop.is_set():
                    version = self._watch_once(version)
            except KubeGone:
                continue
            except KubeError as exc:
                if self._stop.is_set() or self._kube.closed:
                    return
                if self._optional and exc.status in _ABSENT_STATUSES:
                    self._mark_absent(f"{self.resource}: {exc}")
                    self._stop.wait(self._absent_retry)
                    continue
                self._fail(f"{self.resource}: {exc.message}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max)
            except Exception:  # never let the thread die: the cache would silently go stale
                if self._stop.is_set() or self._kube.closed:
                    return
                _LOG.exception("informer failed; listing again")
                self._fail(f"{self.resource}: unexpected error")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max)

    def _fail(self, message: str) -> None:
        if self._healthy or message != self._last_error:
            _LOG.warning("watch failed; listing again", extra={"fields": {"error": message}})
        self._healthy = False
        self._last_error = message
        self._changed()

    def _mark_absent(self, message: str) -> None:
        """An optional resource the server does not serve (or grant): listed, and empty."""
        if message != self._absent:
            _LOG.info("optional resource not served", extra={"fields": {"error": message}})
        with self._lock:
            self._store = {}
            self._by_namespace = {}
        self._absent = message
        self._healthy = True
        self._last_error = ""
        self._synced.set()
        self._changed()

    def _relist(self) -> str:
        items, version = self._kube.list(self.resource, self._selector)
        now = datetime.now(UTC)
        fresh = {key_of(obj): CachedObject(obj, now) for obj in items}
        with self._lock:
            for key, cached in fresh.items():  # keep the receipt time of unchanged objects
                old = self._store.get(key)
                if old is not None and _rv(old.obj) == _rv(cached.obj):
                    fresh[key] = old
            self._store = fresh
            self._by_namespace = {}
            for (namespace, name), cached in fresh.items():
                self._by_namespace.setdefault(namespace, {})[name] = cached
        self._healthy = True
        self._last_error = ""
        self._absent = ""
        self._synced.set()
        self._changed()
        return version

    def _watch_once(self, version: str) -> str:
        for kind, obj in self._kube.watch(
            self.resource, version, self._selector, self._watch_seconds
        ):
            if self._stop.is_set():
                return version
            version = _rv(obj) or version
            if kind == "BOOKMARK":
                continue
            key = key_of(obj)
            with self._lock:
                if kind == "DELETED":
                    self._store.pop(key, None)
                    self._by_namespace.get(key[0], {}).pop(key[1], None)
                else:
                    cached = CachedObject(obj, datetime.now(UTC))
                    self._store[key] = cached
                    self._by_namespace.setdefault(key[0], {})[key[1]] = cached
            self._healthy = True
            self._changed()
        return version


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def caches_readiness(informers: Iterable[Informer]) -> tuple[bool, str]:
    """(ready, why not) of a plugin whose answers come from these caches: every one listed
    and its watch healthy (a readiness probe)."""
    for informer in informers:
        if not informer.synced:
            reason = informer.last_error or "first list in progress"
            return False, f"{informer.resource} not listed yet: {reason}"
        if not informer.healthy:
            return False, f"{informer.resource} watch failing: {informer.last_error}"
    return True, ""


def require_listed(informers: Iterable[Informer], where: str) -> None:
    """Unavailable (retry) while one of the caches has not listed its objects yet; where names
    the API server in the message ("hub", "hub east")."""
    for informer in informers:
        if not informer.synced:
            reason = informer.last_error or "the first list is in progress"
            raise Unavailable(f"{where}: {informer.resource} not listed yet ({reason}); retry")
