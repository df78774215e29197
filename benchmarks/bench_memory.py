"""What the orchestrator's memory is made of at N clusters: the imports and each long-lived
structure, in bytes per cluster. Prints numbers; it is not a test (issue 21: peak RSS at 10,000
clusters <= 150 MiB; `benchmarks.bench_orchestrator --rss-clusters 10000` measures the real
process on the real stack).

    python -m benchmarks.bench_memory [--clusters 10000] [--top 12]

Two parts:
- imports: a fresh interpreter imports what `fleet-orchestrator run` imports (orchestrator.cli
  and the manager); its max RSS, its module count, and the packages with the most modules.
- structures: a run of N clusters (floor 80 %) is driven in this process by the real RunDriver
  over the what-if's in-memory fleet (orchestrator.pipeline.simulate.ModelFleet) until its
  first wave is up to date (the point bench_orchestrator's --rss-clusters stops at), then the
  long-lived structures the orchestrator keeps for such a run are built as the controllers
  build them, from wire-shaped input (JSON bytes decoded by orjson as adapters.kube does,
  contract protobufs as the plugin sends them): the ClusterUpgrade cache (ObjectCache, lean),
  the UpdateRun controller's kept state (the run's parsed Upgrades, every ClusterUpgrade's
  holding), the inventory's converted rows
  (GrpcProvider.converted), the operation tracker, the run's RunIndex, and the ClusterVersion
  and UpdateRun objects with their parsed specs. Each structure is charged the objects it
  reaches that no structure before it reached (a shared string is charged once), and
  tracemalloc says which source lines allocated what is alive at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterable
from datetime import timedelta
from types import FunctionType, ModuleType
from typing import Any

import orjson

from benchmarks.bench_orchestrator import NEW, _fleet, _spec
from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator import api
from orchestrator.engine.observations import ClusterObs, OpObs, OpState
from orchestrator.pipeline.simulate import T0

__all__ = ["main"]

MIB = 1024 * 1024
#: What `fleet-orchestrator run` imports before it serves (orchestrator.cli's `run` verb).
RUN_IMPORTS = "import orchestrator.cli, orchestrator.controllers.manager"
_PROBE = """
import sys, collections
{imports}
# VmHWM, not getrusage's ru_maxrss: a child keeps its parent's maximum across fork and exec.
hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))
tops = collections.Counter(m.split('.')[0] for m in sys.modules)
print(__import__('json').dumps({{
    'maxrss_mib': hwm / 1024,
    'modules': len(sys.modules),
    'top': tops.most_common({top}),
    'loaded': sorted(k for k in ('kubernetes', 'requests', 'oauthlib', 'google', 'rich',
                                 'websocket', 'cryptography', 'yaml') if k in sys.modules),
}}))
"""


def imports(top: int) -> dict[str, Any]:
    """Max RSS and modules of a fresh interpreter that imports what `run` imports."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(imports=RUN_IMPORTS, top=top)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    bare = subprocess.run(
        [sys.executable, "-c", _PROBE.format(imports="", top=1)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    result["bare_interpreter_mib"] = json.loads(bare)["maxrss_mib"]
    return result


# -- the run, as the controllers keep it ---------------------------------------------------------

PLUGIN = "127.0.0.1:9090"


def _wire(obj: dict[str, Any]) -> dict[str, Any]:
    """obj as adapters.kube hands it over: JSON bytes from the apiserver decoded by orjson."""
    return orjson.loads(orjson.dumps(obj))


def _server_meta(name: str, labels: dict[str, str], rv: int, owner: dict[str, Any] | None) -> Any:
    meta = {
        "name": name,
        "namespace": "bench",
        "uid": str(uuid.uuid4()),
        "resourceVersion": str(rv),
        "generation": 1,
        "creationTimestamp": "2026-11-26T16:00:00Z",
        "labels": labels,
        "finalizers": [api.FINALIZER],
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def _operation_pb(op: OpObs) -> cluster_pb2.Operation:
    from orchestrator.adapters.provider import _KIND  # noqa: PLC0415

    state = {
        OpState.PENDING: cluster_pb2.OPERATION_STATE_PENDING,
        OpState.RUNNING: cluster_pb2.OPERATION_STATE_RUNNING,
        OpState.SUCCEEDED: cluster_pb2.OPERATION_STATE_SUCCEEDED,
        OpState.FAILED: cluster_pb2.OPERATION_STATE_FAILED,
    }[op.state]
    return cluster_pb2.Operation(
        id=op.id,
        kind={mine: theirs for theirs, mine in _KIND.items()}[op.kind],
        request_id=op.request_id,
        cluster_id=op.cluster_id,
        state=state,
        node_pool=op.node_pool,
        target_version=op.target_version,
    )


def _cluster_pb(c: ClusterObs) -> cluster_pb2.Cluster:
    pb = cluster_pb2.Cluster(
        id=c.id,
        control_plane_version=c.control_plane_version,
        labels=dict(c.labels),
        available=c.available,
        in_service=c.in_service,
    )
    for p in c.node_pools:
        pb.node_pools.add(name=p.name, version=p.version, status=cluster_pb2.NODE_POOL_STATUS_READY)
    if c.current_operation is not None:
        pb.current_operation.CopyFrom(_operation_pb(c.current_operation))
    return pb


class _Plugin:
    """The plugin as the orchestrator sees it over gRPC: ListClusters answers (protobufs made
    from the what-if's fleet) and the operation watch, through the real adapter
    (GrpcProvider's conversion cache, OperationTracker)."""

    def __init__(self, fleet: Any) -> None:
        from orchestrator.adapters.provider import KeptInventory, OperationTracker  # noqa: PLC0415

        self.fleet = fleet
        self.tracker = OperationTracker(lambda plugin, op: None)
        self.kept = KeptInventory()
        self._pbs: dict[str, tuple[ClusterObs, cluster_pb2.Cluster]] = {}
        self._ops: dict[str, OpObs] = {}

    plugin_name = PLUGIN

    # the client's ListClusters (a plugin without revisions: listed whole every time)
    def list_since(self, changed_since: str = "", page_size: int = 500) -> Any:
        from plugins.sdk.client import ClusterListing  # noqa: PLC0415

        return ClusterListing(self.list_clusters(page_size), "", False, [])

    def list_clusters(self, page_size: int) -> list[cluster_pb2.Cluster]:
        out = []
        for cid, obs in self.fleet.clusters.items():
            known = self._pbs.get(cid)
            if known is None or known[0] is not obs:
                known = (obs, _cluster_pb(obs))
                self._pbs[cid] = known
            out.append(known[1])
        return out

    def watch(self) -> None:
        """What WatchOperations delivers: every operation whose state changed."""
        from orchestrator.adapters.provider import op_from_pb  # noqa: PLC0415

        for op_id, op in self.fleet.ops.items():
            if self._ops.get(op_id) is not op:
                self._ops[op_id] = op
                self.tracker.put(PLUGIN, op_from_pb(_operation_pb(op)))

    # the driver's Provider
    supports_preflight = True

    def snapshot(self, cluster_ids: Any) -> Any:
        from orchestrator.adapters.provider import GrpcProvider  # noqa: PLC0415

        return GrpcProvider(self, self.tracker, lambda: T0, kept=self.kept).snapshot(  # type: ignore[arg-type]
            cluster_ids
        )

    def preflight(self, cluster_id: str, version: str, pools: Any) -> Any:
        return self.fleet.preflight(cluster_id, version, pools)

    def call(self, call: Any) -> OpObs:
        op = self.fleet.call(call)
        self.watch()
        return op


class _Store:
    """The UpdateRun controller's side: the ClusterUpgrade cache fed by write answers (as
    _KubeStore), kept as the controller keeps it (kept.KeptUpgrades: every ClusterUpgrade's
    holding, the run's Children with the objects parsed per resourceVersion)."""

    def __init__(self, upgrades: Iterable[Any]) -> None:
        from orchestrator.adapters.cache import ObjectCache  # noqa: PLC0415
        from orchestrator.controllers.kept import KeptUpgrades  # noqa: PLC0415
        from orchestrator.controllers.updaterun import upgrade_from_obj  # noqa: PLC0415

        self.cache = ObjectCache(None, api.CLUSTER_UPGRADE_PLURAL, None, index_label=api.LABEL_RUN)  # type: ignore[arg-type]
        #: No plugin identity learned (the ClusterUpgrades pin theirs).
        self.kept = KeptUpgrades(self.cache, dict, upgrade_from_obj)
        self.rv = 1000
        owner = {
            "apiVersion": api.API_VERSION,
            "kind": api.UPDATE_RUN_KIND,
            "name": "bench-1",
            "uid": str(uuid.uuid4()),
            "controller": True,
            "blockOwnerDeletion": True,
        }
        for u in upgrades:
            self.rv += 1
            obj = {
                "apiVersion": api.API_VERSION,
                "kind": api.CLUSTER_UPGRADE_KIND,
                "metadata": _server_meta(u.name, {api.LABEL_RUN: "bench-1"}, self.rv, owner),
                "spec": u.spec.dump(),
            }
            self.cache.put(_wire(obj))

    @property
    def children(self) -> Any:
        """The run's kept.Children."""
        return self.kept.children("bench", "bench-1")

    def upgrades(self) -> dict[str, Any]:
        """The run's upgrades as the UpdateRun controller has them: the kept state synced with
        the cache (parsed again only where an object's resourceVersion moved), by name."""
        self.kept.sync()
        upgrades = self.children.upgrades
        return {name: upgrades[name] for name in sorted(upgrades)}

    def write_upgrade_status(self, upgrade: Any, status: api.ClusterUpgradeStatus) -> None:
        old = self.cache.get("bench", upgrade.name)
        assert old is not None
        self.rv += 1
        new = dict(old, status=status.dump())
        new["metadata"] = dict(old["metadata"], resourceVersion=str(self.rv))
        self.cache.put(_wire(new))


def _first_wave(count: int) -> tuple[Any, _Store, _Plugin, api.UpdateRunSpec, dict[str, Any]]:
    """A run of count clusters driven until a fifth of them are Upgraded."""
    from orchestrator.engine.initialize import pin_upgrades  # noqa: PLC0415
    from orchestrator.pipeline.driver import RunDriver  # noqa: PLC0415
    from orchestrator.pipeline.simulate import ModelFleet  # noqa: PLC0415

    clusters = _fleet(count)
    spec = _spec(clusters, count * 4 // 5, staged=False)
    pinned = pin_upgrades("bench", spec, clusters)
    assert not isinstance(pinned, list), pinned
    fleet = ModelFleet(clusters)
    store = _Store(pinned.upgrades)
    plugin = _Plugin(fleet)

    class _AllPass:
        def evaluate(self, checks: Any, clusters: Any, stage: str) -> list[Any]:
            return [api.CheckResult(name=c.name, passed=True) for c in checks.checks]

    class _Leader:
        def held(self) -> bool:
            return True

    preflights: dict[str, Any] = {}
    driver = RunDriver(plugin, store, _AllPass(), _Leader(), preflights)
    stages: list[api.StageStatus] = []
    wave = count // 5
    for _ in range(10_000):
        upgrades = store.upgrades()
        done = sum(1 for u in upgrades.values() if u.status.phase == api.UpgradePhase.UPGRADED)
        if done >= wave:
            break
        result = driver.step(
            key="bench/bench-1",
            uid="bench",
            spec=spec,
            upgrades=upgrades,
            stages=stages,
            held_by={},
            now=T0 + timedelta(seconds=fleet.now),
        )
        stages = list(result.decision.stages)
        if not (result.calls_made or result.decision.changed):
            fleet.now += 1.0
            fleet.advance_to(fleet.now)
            plugin.watch()
    return driver, store, plugin, spec, preflights


def structures(count: int) -> tuple[list[tuple[str, Any]], _Store, _Plugin]:
    """The long-lived structures, in the order they are charged (and what made them)."""
    driver, store, plugin, spec, preflights = _first_wave(count)
    from orchestrator.adapters.cache import lean  # noqa: PLC0415
    from orchestrator.engine.initialize import run_for  # noqa: PLC0415

    # The ClusterVersion as its cache keeps it, and the run made for it (run_for: without the
    # cluster list), as the runs' cache keeps it; each parsed once (SpecCache).
    cv = lean(
        _wire(
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "metadata": _server_meta("bench", {}, 10, None),
                "spec": {
                    "version": NEW,
                    "requiredAvailableCount": count * 4 // 5,
                    "opsEndpoint": {"endpoint": PLUGIN, "insecure": True},
                    "clusters": [{"id": c.id, "version": NEW} for c in spec.clusters or []],
                },
            }
        )
    )
    cv_spec = api.ClusterVersionSpec.model_validate(cv["spec"])
    _, run_spec = run_for("bench", 1, cv_spec, None)
    run = lean(
        _wire(
            {
                "apiVersion": api.API_VERSION,
                "kind": api.UPDATE_RUN_KIND,
                "metadata": _server_meta("bench-1", {}, 11, None),
                "spec": run_spec.dump(),
            }
        )
    )
    specs = [cv, run, cv_spec, api.UpdateRunSpec.model_validate(run["spec"])]
    return (
        [
            ("ClusterUpgrade cache (ObjectCache: lean dicts)", store.cache),
            ("parsed Upgrades (kept.Children of the run)", store.children),
            ("holdings (kept.KeptUpgrades.holdings: crossrun.HoldingIndex)", store.kept.holdings),
            ("inventory rows (KeptInventory: ClusterObs by wire bytes)", plugin.kept),
            (f"operation tracker ({len(plugin.fleet.ops)} operations)", plugin.tracker),
            ("the run's RunIndex", driver.index),
            ("preflight answers (RunDriver.preflight_cache)", preflights),
            ("ClusterVersion + UpdateRun dicts and parsed specs", specs),
        ],
        store,
        plugin,
    )


_SKIP = (type, ModuleType, FunctionType)


def _owned(root: Any, seen: set[int]) -> int:
    """Bytes of the objects reachable from root that are not in seen (then added to it)."""
    total, todo = 0, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


def _rebuild(store: _Store, plugin: _Plugin) -> list[Any]:
    """The same structures made again from the same input (for tracemalloc's lines): the
    cached objects decoded again, parsed, the inventory converted, the operations tracked,
    an index built."""
    from orchestrator.adapters.provider import (  # noqa: PLC0415
        GrpcProvider,
        KeptInventory,
        OperationTracker,
        op_from_pb,
    )
    from orchestrator.engine.index import RunIndex  # noqa: PLC0415

    again = _Store(())
    for obj in store.cache.items():
        again.cache.put(_wire(obj))
    upgrades = again.upgrades()
    kept = KeptInventory()
    clusters = GrpcProvider(plugin, plugin.tracker, lambda: T0, kept=kept).inventory()  # type: ignore[arg-type]
    tracker = OperationTracker(lambda plugin, op: None)
    for op in plugin.fleet.ops.values():
        tracker.put(PLUGIN, op_from_pb(_operation_pb(op)))
    index = RunIndex.build("bench", upgrades, clusters)
    index.observe_world(clusters, {}, tracker.by_request())
    return [again, kept, tracker, index]


def measure(count: int, top: int) -> dict[str, Any]:
    """Per structure, bytes (and per cluster); then tracemalloc's top lines of the same
    structures made again."""
    built, store, plugin = structures(count)
    gc.collect()
    seen: set[int] = set()
    # What the module-level state already holds (enum members, interned names) is not charged.
    for module in list(sys.modules.values()):
        _owned(vars(module), seen)
    rows = []
    for name, value in built:
        size = _owned(value, seen)
        rows.append({"structure": name, "mib": size / MIB, "bytes_per_cluster": size / count})
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    rebuilt = _rebuild(store, plugin)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    del rebuilt
    diff = after.compare_to(before, "lineno")
    return {
        "clusters": count,
        "structures": rows,
        "total_mib": sum(r["mib"] for r in rows),
        "traced_mib": sum(s.size_diff for s in diff) / MIB,
        "top_lines": [
            {"where": str(s.traceback), "mib": s.size_diff / MIB, "count": s.count_diff}
            for s in diff[:top]
        ],
    }


def _print(imp: dict[str, Any], mem: dict[str, Any]) -> None:
    print(f"imports of `run` ({RUN_IMPORTS}):")
    print(
        f"  max RSS {imp['maxrss_mib']:.1f} MiB ({imp['bare_interpreter_mib']:.1f} MiB a bare "
        f"interpreter), {imp['modules']} modules"
    )
    print("  modules by package: " + ", ".join(f"{k} {v}" for k, v in imp["top"]))
    print("  heavy packages loaded: " + (", ".join(imp["loaded"]) or "none"))
    n = mem["clusters"]
    print(f"\nlong-lived structures at {n:,} clusters, first wave up to date:")
    for r in mem["structures"]:
        print(f"  {r['mib']:7.1f} MiB  {r['bytes_per_cluster']:7.0f} B/cluster  {r['structure']}")
    print(f"  {mem['total_mib']:7.1f} MiB in all")
    print(
        f"\nwhere the same structures made again allocate (tracemalloc: "
        f"{mem['traced_mib']:.1f} MiB in all):"
    )
    for line in mem["top_lines"]:
        print(f"  {line['mib']:7.1f} MiB  {line['count']:8d}  {line['where']}")


def main(argv: Iterable[str] | None = None) -> int:
    """Measures and prints; --json also writes the numbers."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_memory")
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=12, help="tracemalloc lines shown")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers here")
    args = parser.parse_args(list(argv) if argv is not None else None)
    imp = imports(args.top)
    mem = measure(args.clusters, args.top)
    _print(imp, mem)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"imports": imp, "memory": mem}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
