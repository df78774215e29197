"""A list+watch cache of one kind of ours across namespaces, kept current by our own writes too.

`AccessCatalog` holds the caches of the cluster-scoped FleetProviders and MetricSources and
feeds them to the pure access rule (orchestrator.access.check_access).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from orchestrator import api
from orchestrator.adapters.kube import Gone, KubeClient, NotFound, WatchEvent
from orchestrator.engine.access import Access, AccessPolicy, check_access, needs_labels
from orchestrator.engine.memo import BoundedMemo
from orchestrator.engine.validate import Problem

__all__ = ["SHARED_MAX", "AccessCatalog", "ObjectCache", "lean", "settle_heap"]

M = TypeVar("M", api.FleetProviderSpec, api.MetricSourceSpec)

log = logging.getLogger(__name__)
Key = tuple[str, str]
#: Annotations nothing here reads, each as large as what was applied (kubectl apply keeps the
#: whole object in it: a ClusterVersion of 5,000 clusters is ~250 KB of spec).
UNUSED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
#: Stores between two freezes of the collector's heap, at least (and at least the cache's size).
FREEZE_EVERY = 1000
#: Stores between two returns of malloc's free memory to the system (`_trim`; also at each
#: freeze): ~1-3 ms each at 10,000 clusters.
TRIM_EVERY = 1000
#: The youngest generation's threshold once the heap is settled (`settle_heap`; CPython's
#: default is 700 allocations). A young collection walks every container made since the last
#: one, and a pass makes fleet-sized ones (the inventory, the upgrades by name: 20,000 entries
#: each at 20,000 clusters) that are alive while it runs: at 700, a pass of 1 % changed at
#: 20,000 clusters made ~5 young collections of ~0.25 ms each, mostly walking those. At
#: 10,000 one comes every dozen such passes (issue 21). What waits longer for the collector
#: is garbage in reference cycles: the peak RSS at 10,000 clusters measured 149-150 MiB with
#: it, 147-149 without (runs of one code spread by 2-3 MiB).
YOUNG_THRESHOLD = 10_000


def lean(obj: dict[str, Any]) -> dict[str, Any]:
    """obj without what the orchestrator never reads, in place: `managedFields` (server-side
    apply's field ownership, most of a ClusterUpgrade's bytes: each status writer and each
    field it set) and UNUSED_ANNOTATIONS. Writes never send a cached object back whole (status
    is written whole, metadata by merge or JSON patch of named fields), so nothing is lost.
    Its strings are `shared`, and so are its metadata's labels, annotations, finalizers and
    ownerReferences when another object has them equal (`_shared_parts`)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if annotations:
            for key in UNUSED_ANNOTATIONS:
                annotations.pop(key, None)
    _share(obj)
    if isinstance(meta, dict):
        _share_parts(meta)
    return obj


#: Metadata fields whose values repeat whole across many objects (every ClusterUpgrade of a run
#: has the same run label, finalizer and owner): one equal value, one object.
_PARTS = ("labels", "annotations", "finalizers", "ownerReferences")
#: The shared values by their JSON (with the field's name), at most 4,096 (values no longer
#: remembered stay alive only while objects hold them).
_shared_parts: BoundedMemo[bytes, Any] = BoundedMemo(4096)


def _share_parts(meta: dict[str, Any]) -> None:
    """meta's _PARTS replaced, in place, by an equal value another object already holds (at
    10,000 ClusterUpgrades of one run, ~600 bytes each: a labels dict, a finalizers list and an
    ownerReferences list with its dict). Cached objects are never edited in place (writes send
    patches; `lean` edits only the object it is given, before it is cached), so sharing the
    values is safe."""
    for part in _PARTS:
        value = meta.get(part)
        if not value:
            continue
        key = part.encode() + orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        meta[part] = _shared_parts.keep(key, value)


#: Strings longer than this are kept as decoded (messages, specs' free text: rarely repeated).
SHARED_MAX = 128
#: An object's own identity in its metadata: unique to it, so kept as decoded (an interned
#: string costs a slot in the interpreter's table, ~40 bytes, for nothing shared).
_OWN = frozenset({"name", "uid", "resourceVersion"})


def _share(node: dict[str, Any] | list[Any], own: frozenset[str] = frozenset()) -> None:
    """Every string value in node (dicts and lists, recursively) replaced, in place, by the
    interned string of the same value (sys.intern): the values that repeat across thousands of
    objects (apiVersion, kind, namespace, the run's name and uid in labels and ownerReferences,
    finalizers, versions, stage, provider, phase, timestamps) are one object, not one per
    object; the parsed models keep the same strings (pydantic does not copy a str). About a
    third of a cached ClusterUpgrade's bytes at 10,000 clusters (issue 21). Dict keys are
    already shared by the JSON decoder's key cache; metadata's own name, uid and
    resourceVersion are left as they are (_OWN)."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        if type(value) is str:
            if len(value) <= SHARED_MAX and key not in own:
                node[key] = sys.intern(value)  # type: ignore[index]
        elif isinstance(value, (dict, list)):
            _share(value, _OWN if key == "metadata" else frozenset())


def settle_heap() -> None:
    """Collect, then move every object alive into the collector's permanent generation: the
    caches' objects live long, and full collections then walk only what came after (at 5,000
    clusters they were 44 collections of ~170 ms over a rollout). What is frozen is still freed
    by reference counting when the cache drops it. Then the C library's free memory goes back
    to the system (`_trim`). The youngest generation is collected less often
    (YOUNG_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *older)
    _trim()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (another C library: musl, macOS)."""
    import ctypes  # noqa: PLC0415

    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()


def _trim() -> None:
    """Give the pages malloc holds free back to the system (glibc's malloc_trim(0)): what
    does not fit Python's small-object allocator (dicts of more than a few keys, the objects'
    JSON, protobuf buffers) is freed into malloc's heaps, which by themselves return only free
    memory at their top; a replaced object's space elsewhere stayed resident, counted in RSS
    until reused (issue 21: the peak at 10,000 clusters)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


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
        quiet_echoes: bool = False,
    ) -> None:
        """quiet_echoes: a watch event for a version `put` already recorded (the echo of a
        write whose writer acted on it) does not call on_change."""
        self._kube = kube
        self._quiet_echoes = quiet_echoes
        self._plural = plural
        self._namespace = namespace
        self._label = index_label
        self._on_change = on_change
        self._objs: dict[Key, dict[str, Any]] = {}
        self._index: dict[tuple[str, str], set[Key]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        #: Objects stored since the heap was last frozen, and when malloc was last trimmed.
        self._stored = 0
        self._trimmed_at = 0
        #: Per reader of changes (`follow`): the keys stored or dropped since it last looked
        #: (None: everything, as after a re-list).
        self._followers: list[list[set[Key] | None]] = []
        #: Our writes in flight (`writing`), by key: how many, the versions their answers
        #: stored (`put(own=True)`), and the watch events held back meanwhile.
        self._writing: dict[Key, int] = {}
        self._own: dict[Key, set[int]] = {}
        self._held: dict[Key, list[tuple[int, str, dict[str, Any]]]] = {}

    def _index_key(self, obj: dict[str, Any]) -> tuple[str, str] | None:
        if self._label is None:
            return None
        value = (obj["metadata"].get("labels") or {}).get(self._label)
        return (obj["metadata"].get("namespace", ""), value) if value else None

    @contextmanager
    def writing(self, namespace: str, name: str) -> Iterator[None]:
        """Around a write of ours to one object whose answer is `put(answer, own=True)` inside:
        with quiet_echoes, what the watch says of the object meanwhile is held back until the
        answer is in. The watch's echo of the write (the answer's own version) then wakes
        nobody, whichever of the two came first; any other version (another writer's, or
        anything at all when the write failed) calls on_change as it would have. Issue 21:
        the echo came first often enough that a third of a rollout's passes were woken by
        writes their run had already decided on."""
        key = (namespace, name)
        with self._lock:
            self._writing[key] = self._writing.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._writing[key] - 1
                if left:
                    self._writing[key] = left
                    held: list[tuple[int, str, dict[str, Any]]] = []
                    own: set[int] = set()
                else:
                    del self._writing[key]
                    held = self._held.pop(key, [])
                    own = self._own.pop(key, set())
            if self._on_change is not None:
                for rv, event, obj in held:
                    if rv not in own:
                        self._on_change(event, obj)

    def put(self, obj: dict[str, Any], deleted: bool = False, own: bool = False) -> bool:
        """Record an object (from a watch event or a write's answer; kept `lean`, in place);
        False when it is no news (an older copy, or the echo of our own write already recorded
        from its answer). own: the answer of a write made in `writing`."""
        meta = lean(obj)["metadata"]
        key = (meta.get("namespace", ""), meta["name"])  # "": a cluster-scoped kind
        with self._lock:
            if own and key in self._writing:
                self._own.setdefault(key, set()).add(_rv(obj))
            old = self._objs.get(key)
            if old is not None:
                seen, rv = _rv(old), _rv(obj)
                if seen > rv or (seen == rv and rv != 0 and not deleted):
                    return False
            if old is not None:
                ik = self._index_key(old)
                if ik is not None:
                    self._index.get(ik, set()).discard(key)
            for changed in self._followers:
                if changed[0] is not None:
                    changed[0].add(key)
            if deleted:
                return self._objs.pop(key, None) is not None
            self._objs[key] = obj
            self._stored += 1
            ik = self._index_key(obj)
            if ik is not None:
                self._index.setdefault(ik, set()).add(key)
            return True

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

    def follow(self) -> Callable[[], set[Key] | None]:
        """A reader of what changes here: each call of the function returned gives the keys
        stored or dropped since its previous call; None (the first call, and after a re-list)
        means everything, to be read again whole."""
        changed: list[set[Key] | None] = [None]
        with self._lock:
            self._followers.append(changed)

        def take() -> set[Key] | None:
            with self._lock:
                keys, changed[0] = changed[0], set()
            return keys

        return take

    def _held_back(self, event: WatchEvent) -> bool:
        """Whether a watch event waits for a write of ours to its object (`writing`)."""
        if not self._quiet_echoes:
            return False
        meta = event.obj.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            if key not in self._writing:
                return False
            self._held.setdefault(key, []).append((_rv(event.obj), event.type, event.obj))
            return True

    def _settle(self) -> None:
        """Freeze the heap (settle_heap) once as many objects as the cache holds were stored
        since the last time: the frozen copies were mostly replaced by then."""
        self._stored = self._trimmed_at = 0
        settle_heap()

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
                        for changed in self._followers:
                            changed[0] = None
                    for obj in items:
                        self.put(obj)
                    del items
                    self._settle()
                    self.synced.set()
                for event in self._kube.watch_objects(self._plural, self._namespace, rv, 60):
                    meta = event.obj.get("metadata", {})
                    rv = meta.get("resourceVersion", rv)
                    if event.type == "BOOKMARK":
                        continue
                    news = self.put(event.obj, deleted=event.type == "DELETED")
                    # With quiet_echoes, the echo of our own write wakes nobody: the reconcile
                    # that wrote it already decided on it (a pass per change, not per event).
                    # A news event for an object we are writing waits for the write's answer.
                    wake = (news or not self._quiet_echoes) and not (
                        news and self._held_back(event)
                    )
                    if wake and self._on_change is not None:
                        self._on_change(event.type, event.obj)
                    stored = self._stored
                    if stored >= max(FREEZE_EVERY, len(self._objs)):
                        self._settle()
                    elif stored - self._trimmed_at >= TRIM_EVERY:
                        self._trimmed_at = stored
                        _trim()
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


#: How long a namespace's labels are trusted (selectors in allowedNamespaces).
LABELS_TTL_SECONDS = 30.0


class AccessCatalog:
    """FleetProviders and MetricSources (cluster-scoped caches) and the orchestrator's policy:
    what `check` needs to decide what a namespace's spec may use, before anything is called."""

    def __init__(
        self,
        kube: KubeClient,
        policy: AccessPolicy,
        on_change: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self._kube = kube
        self.policy = policy
        self.providers = ObjectCache(kube, api.FLEET_PROVIDER_PLURAL, None, on_change=on_change)
        self.sources = ObjectCache(kube, api.METRIC_SOURCE_PLURAL, None, on_change=on_change)
        self._labels: dict[str, tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._parse_lock = threading.Lock()
        #: Parsed specs by name, with the resourceVersion they were parsed at.
        self._providers: dict[str, tuple[str, api.FleetProviderSpec | None]] = {}
        self._sources: dict[str, tuple[str, api.MetricSourceSpec | None]] = {}

    @staticmethod
    def _parsed(
        model: type[M], cache: ObjectCache, known: dict[str, tuple[str, M | None]]
    ) -> dict[str, M | None]:
        """Every cached object's spec by name, parsed again only when resourceVersion moved."""
        out: dict[str, M | None] = {}
        for obj in cache.items():
            meta = obj["metadata"]
            name, rv = meta["name"], str(meta.get("resourceVersion", ""))
            seen = known.get(name)
            if seen is None or seen[0] != rv:
                seen = (rv, _parse(model, obj))
                known[name] = seen
            out[name] = seen[1]
        for gone in set(known) - set(out):
            del known[gone]
        return out

    def caches(self) -> tuple[ObjectCache, ObjectCache]:
        """The two caches (to run and to wait for)."""
        return self.providers, self.sources

    def check(
        self, namespace: str, spec: api.ClusterVersionSpec | api.UpdateRunSpec
    ) -> Access | list[Problem]:
        """orchestrator.access.check_access over the cached objects (a NotFound namespace has
        no labels)."""
        with self._parse_lock:  # the reconcile loop and the webhook's threads may both ask
            providers = self._parsed(api.FleetProviderSpec, self.providers, self._providers)
            sources = self._parsed(api.MetricSourceSpec, self.sources, self._sources)
        labels = self._namespace_labels(namespace) if needs_labels(providers, sources) else None
        return check_access(namespace, spec, providers, sources, self.policy, labels)

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            known = self._labels.get(namespace)
        if known is not None and now - known[0] < LABELS_TTL_SECONDS:
            return known[1]
        try:
            labels = self._kube.namespace_labels(namespace)
        except NotFound:
            labels = {}
        with self._lock:
            self._labels[namespace] = (now, labels)
        return labels


def _parse(model: type[M], obj: dict[str, Any]) -> M | None:
    """The spec of a declared object, or None (check_access then says it is invalid)."""
    try:
        return model.model_validate(obj.get("spec") or {})
    except ValidationError:
        log.debug("%s %s has an invalid spec", model.__name__, obj["metadata"]["name"])
        return None
