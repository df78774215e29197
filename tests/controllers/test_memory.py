"""What keeps the orchestrator's memory small at 10,000 clusters (issue 21) keeps what it holds
the same: the cache's shared strings, the models' shared field sets, the tracker's ages, the
parsed spec kept across status changes."""

from __future__ import annotations

import copy
import dataclasses
import gc
from typing import Any

import orjson
import pytest
import yaml
from pydantic import ValidationError

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator import api
from orchestrator.adapters import cache as cache_module
from orchestrator.adapters.cache import SHARED_MAX, ObjectCache, lean, settle_heap
from orchestrator.adapters.provider import OperationTracker, cluster_from_pb, op_from_pb
from orchestrator.api.crd import crd_yaml
from orchestrator.controllers import kept as kept_module
from orchestrator.controllers.kept import NOT_STARTED, Children, parse_status
from orchestrator.controllers.updaterun import upgrade_from_obj
from orchestrator.engine.decide import Upgrade
from orchestrator.engine.observations import ClusterObs, OpKind, OpObs, OpState, PoolObs
from orchestrator.pipeline.crossrun import holding_of


def _upgrade(name: str, rv: int, message: str = "") -> dict[str, object]:
    status = {"phase": "ServicingOut", "step": "serviceOut", "startTime": "2026-11-26T16:00:00Z"}
    if message:
        status["message"] = message
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.CLUSTER_UPGRADE_KIND,
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "resourceVersion": str(rv),
            "labels": {api.LABEL_RUN: "run-1"},
            "finalizers": [api.FINALIZER],
            "ownerReferences": [{"kind": api.UPDATE_RUN_KIND, "name": "run-1", "uid": "u-run-1"}],
            "managedFields": [{"manager": "fleet-orchestrator", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {
            "clusterId": f"cluster-{name}",
            "stage": "canary",
            "stageIndex": 0,
            "version": "1.29.4",
            "nodeVersion": "1.29.4",
            "provider": "127.0.0.1:9090",
        },
        "status": status,
    }
    # As the apiserver's answer is decoded: every string a new object.
    return dict(orjson.loads(orjson.dumps(body)))


def test_cached_objects_share_their_repeated_strings_and_keep_their_values() -> None:
    long = "x" * (SHARED_MAX + 1)
    a, b = _upgrade("a", 1, long), _upgrade("b", 2, long)
    assert a["spec"]["version"] is not b["spec"]["version"]  # type: ignore[index]
    want = copy.deepcopy(a)
    del want["metadata"]["managedFields"]  # type: ignore[attr-defined]
    cache = ObjectCache(None, api.CLUSTER_UPGRADE_PLURAL, None, index_label=api.LABEL_RUN)  # type: ignore[arg-type]
    assert cache.put(a) and cache.put(b)
    got_a, got_b = cache.get("team-a", "a"), cache.get("team-a", "b")
    assert got_a == want  # the same values, managedFields dropped
    assert got_a is not None and got_b is not None
    for path in (("spec", "version"), ("spec", "provider"), ("status", "startTime")):
        assert got_a[path[0]][path[1]] is got_b[path[0]][path[1]]
    assert got_a["metadata"]["labels"][api.LABEL_RUN] is got_b["metadata"]["labels"][api.LABEL_RUN]
    assert got_a["metadata"]["finalizers"][0] is got_b["metadata"]["finalizers"][0]
    owner_a, owner_b = (
        got_a["metadata"]["ownerReferences"][0],
        got_b["metadata"]["ownerReferences"][0],
    )
    assert owner_a["uid"] is owner_b["uid"] and owner_a["name"] is owner_b["name"]
    # A long free text is left as decoded (rarely repeated); equal all the same.
    assert got_a["status"]["message"] == got_b["status"]["message"] == long
    assert got_a["status"]["message"] is not got_b["status"]["message"]
    # Parsed models keep the cache's strings (no second copy).
    spec = api.ClusterUpgradeSpec.model_validate(got_b["spec"])
    assert spec.version is got_a["spec"]["version"]


def test_lean_drops_only_what_is_never_read() -> None:
    obj = _upgrade("a", 1)
    obj["metadata"]["annotations"] = {  # type: ignore[index]
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
        api.ANNOTATION_REASON: "maintenance",
    }
    lean(obj)
    assert "managedFields" not in obj["metadata"]  # type: ignore[operator]
    assert obj["metadata"]["annotations"] == {api.ANNOTATION_REASON: "maintenance"}  # type: ignore[index]


def test_models_given_the_same_fields_share_one_fields_set_without_changing_it() -> None:
    a = api.ClusterUpgradeStatus.model_validate({"phase": "Pending", "step": "serviceOut"})
    b = api.ClusterUpgradeStatus.model_validate({"phase": "Upgraded", "step": "serviceIn"})
    c = api.ClusterUpgradeStatus.model_validate({"phase": "Upgraded"})
    assert a.model_fields_set is b.model_fields_set
    assert c.model_fields_set == {"phase"}
    moved = a.model_copy(update={"request_id": "r-1"})
    assert moved.model_fields_set == {"phase", "step", "request_id"}
    assert a.model_fields_set == b.model_fields_set == {"phase", "step"}
    assert moved.request_id == "r-1" and a.request_id is None
    with pytest.raises(ValueError, match="frozen"):
        a.step = "serviceIn"  # type: ignore[misc]
    assert a.model_fields_set == {"phase", "step"}
    assert b.dump() == {"phase": "Upgraded", "step": "serviceIn", "attempt": 0, "retryRound": 0}


def test_observations_have_no_dict_each_and_still_replace() -> None:
    pool = PoolObs("workers", "1.28.5")
    cluster = ClusterObs("c1", "1.28.5", (pool,), {"stage": "canary"})
    op = OpObs("op-1", OpKind.SERVICE_OUT, "c1", OpState.RUNNING, "r-1")
    for obj in (pool, cluster, op):
        assert not hasattr(obj, "__dict__")
    moved = dataclasses.replace(cluster, current_operation=op)
    assert moved.current_operation is op and cluster.current_operation is None
    assert moved == ClusterObs("c1", "1.28.5", (pool,), {"stage": "canary"}, current_operation=op)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.in_service = False  # type: ignore[misc]


def test_the_tracker_ages_operations_in_flight_and_forgets_the_age_of_ended_ones() -> None:
    ended: list[OpObs] = []
    tracker = OperationTracker(lambda plugin, op: ended.append(op))
    running = OpObs("op-1", OpKind.SERVICE_OUT, "c1", OpState.RUNNING, "r-1")
    assert not tracker.put("p", running)
    assert tracker.age("p", "op-1") < 5.0
    done = dataclasses.replace(running, state=OpState.SUCCEEDED)
    assert tracker.put("p", done)  # the first terminal state seen
    assert not tracker.put("p", done)  # seen before: no second end
    assert tracker.age("p", "op-1") == float("inf")
    assert tracker.get("p", "op-1") == done
    assert tracker.by_request()["r-1"] == done
    assert tracker.in_flight() == []


def test_a_status_change_keeps_the_parsed_spec_and_a_new_spec_or_object_is_parsed_again() -> None:
    # What the controller keeps of a run's ClusterUpgrades (kept.Children), with its own parse.
    children = Children()

    def parse(obj: dict[str, Any]) -> Upgrade:
        children.put("a", obj, upgrade_from_obj)
        return children.upgrades["a"]

    def version(rv: int, uid: str = "u-1", generation: int = 1, target: str = "1.29.4") -> Any:
        obj: Any = _upgrade("a", rv)
        obj["metadata"].update(uid=uid, generation=generation)
        obj["spec"]["version"] = target
        return obj

    first = parse(version(1))
    assert parse(version(1)) is first  # same resourceVersion: nothing parsed
    moved = parse(version(2))
    assert moved is not first and moved.spec is first.spec  # status only: the spec is kept
    edited = parse(version(3, generation=2, target="1.30.1"))
    assert edited.spec.version == "1.30.1"
    again = parse(version(4, uid="u-2", generation=2, target="1.29.4"))  # deleted, made again
    assert again.spec.version == "1.29.4" and again.spec is not edited.spec


def test_converted_clusters_share_their_versions_pools_and_labels() -> None:
    def answer(cid: str) -> cluster_pb2.Cluster:
        pb = cluster_pb2.Cluster(id=cid, control_plane_version="1.28.5", labels={"stage": "main"})
        pb.node_pools.add(name="workers", version="1.28.5")
        # As it comes off the wire: every string a new object.
        return cluster_pb2.Cluster.FromString(pb.SerializeToString())

    a, b = cluster_from_pb(answer("c1")), cluster_from_pb(answer("c2"))
    assert a.control_plane_version is b.control_plane_version == "1.28.5"
    assert a.node_pools[0].name is b.node_pools[0].name == "workers"
    assert a.node_pools[0].version is b.node_pools[0].version == "1.28.5"
    assert a.labels == b.labels == {"stage": "main"}
    assert next(iter(a.labels.values())) is next(iter(b.labels.values()))
    assert (a.id, b.id) == ("c1", "c2")


def test_operations_share_their_pool_version_and_error_code() -> None:
    def answer(op_id: str) -> cluster_pb2.Operation:
        pb = cluster_pb2.Operation(
            id=op_id,
            kind=cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL,
            cluster_id="c1",
            state=cluster_pb2.OPERATION_STATE_FAILED,
            node_pool="workers",
            target_version="1.29.4",
            error_code="UPGRADE_FAILED",
        )
        return cluster_pb2.Operation.FromString(pb.SerializeToString())

    a, b = op_from_pb(answer("op-1")), op_from_pb(answer("op-2"))
    assert a.node_pool is b.node_pool == "workers"
    assert a.target_version is b.target_version == "1.29.4"
    assert a.error_code is b.error_code == "UPGRADE_FAILED"
    assert (a.id, b.id, a.state, a.kind) == ("op-1", "op-2", OpState.FAILED, OpKind.NODE_POOL)


def test_clusterupgrades_not_started_share_one_status_and_a_written_one_has_its_own() -> None:
    children = Children()
    for name, rv in (("a", 1), ("b", 2)):
        obj: Any = _upgrade(name, rv)
        del obj["status"]  # created, never started: no status written
        children.put(name, obj, upgrade_from_obj)
    a, b = children.upgrades["a"], children.upgrades["b"]
    assert a.status is b.status is NOT_STARTED
    assert api.ClusterUpgradeStatus() == NOT_STARTED and a.status.phase == api.UpgradePhase.PENDING
    with pytest.raises(ValidationError):  # frozen: no holder can change it for the others
        NOT_STARTED.phase = api.UpgradePhase.FAILED  # type: ignore[misc]
    children.put("a", _upgrade("a", 3), upgrade_from_obj)  # its first status written
    a = children.upgrades["a"]
    assert a.status is not NOT_STARTED and a.status.phase == api.UpgradePhase.SERVICING_OUT
    assert children.upgrades["b"].status is NOT_STARTED
    assert api.ClusterUpgradeStatus() == NOT_STARTED
    assert parse_status({"phase": "Upgraded"}).phase == api.UpgradePhase.UPGRADED


def test_equal_statuses_share_one_model_and_the_memo_stays_bounded() -> None:
    # What the apiserver makes of a ClusterUpgrade created without a status: the CRD's default.
    crd = next(
        d
        for d in yaml.safe_load_all(crd_yaml())
        if d["spec"]["names"]["kind"] == api.CLUSTER_UPGRADE_KIND
    )
    default = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    children = Children()
    for name, rv in (("a", 1), ("b", 2)):
        obj: Any = _upgrade(name, rv)
        obj["status"] = copy.deepcopy(default["default"])
        children.put(name, obj, upgrade_from_obj)
    a, b = children.upgrades["a"], children.upgrades["b"]
    assert a.status is b.status and a.status.phase == api.UpgradePhase.PENDING
    # Equal by value, whatever the order of its keys; a different one is a model of its own.
    one = parse_status({"phase": "ServicingOut", "requestId": "r-1", "attempt": 1})
    assert parse_status({"attempt": 1, "requestId": "r-1", "phase": "ServicingOut"}) is one
    other = parse_status({"phase": "ServicingOut", "requestId": "r-2", "attempt": 1})
    assert other is not one and other.request_id == "r-2" and one.request_id == "r-1"
    for i in range(kept_module._STATUSES_MAX + 10):
        assert parse_status({"phase": "Pending", "attempt": i}).attempt == i
    assert kept_module._status_of.cache_info().currsize <= kept_module._STATUSES_MAX
    with pytest.raises(ValidationError):  # what does not parse is not remembered either
        parse_status({"phase": "NoSuchPhase"})
    # What orjson cannot write (an integer past 64 bits) is parsed all the same, not shared.
    big = {"phase": "Pending", "attempt": 2**70}
    assert parse_status(big).attempt == 2**70 and parse_status(big) is not parse_status(big)


def test_a_cluster_named_by_one_clusterupgrade_keeps_a_name_and_by_several_each_provider() -> None:
    children = Children()

    def put(name: str, rv: int, provider: str) -> None:
        obj: Any = _upgrade(name, rv)
        obj["spec"].update(clusterId="shared", providerId=provider)
        children.put(name, obj, upgrade_from_obj)

    put("b", 1, "sim/b")
    assert children.own_by == {"shared": "b"} and children.own == {"shared": "sim/b"}
    put("a", 2, "sim/a")  # a second names it (made by hand): the least name's provider
    assert children.own_by == {"shared": {"a": "sim/a", "b": "sim/b"}}
    assert children.own == {"shared": "sim/a"}
    put("a", 3, "sim/a2")  # re-pinned
    assert children.own == {"shared": "sim/a2"}
    children.drop("a")
    assert children.own_by == {"shared": "b"} and children.own == {"shared": "sim/b"}
    put("c", 4, "sim/c")
    children.drop("b")
    assert children.own_by == {"shared": "c"} and children.own == {"shared": "sim/c"}
    fresh = Children()
    for name, obj in children.objects.items():
        fresh.put(name, obj, upgrade_from_obj)
    assert children.differences(fresh) == []
    children.drop("c")
    assert children.own_by == {} and children.own == {}


def test_holdings_of_one_run_and_provider_share_their_strings() -> None:
    a, b = _upgrade("a", 1), _upgrade("b", 2)
    for obj in (a, b):
        obj["spec"]["providerId"] = "".join(["sim/", "fleet-1"])  # type: ignore[index]
    ha, hb = holding_of(a, {}), holding_of(b, {})
    assert ha.run == "team-a/run-1" and ha.provider == "sim/fleet-1"
    assert ha.run is hb.run and ha.provider is hb.provider
    assert (ha.cluster_id, hb.cluster_id) == ("cluster-a", "cluster-b")
    # The endpoint fallback (no providerId pinned) is shared alike.
    del a["spec"]["providerId"], b["spec"]["providerId"]  # type: ignore[attr-defined]
    fa, fb = holding_of(a, {}), holding_of(b, {})
    assert fa.provider == "endpoint/127.0.0.1:9090" and fa.provider is fb.provider


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(cache_module._MALLOC_TRIM is None, reason="not glibc: no malloc_trim")
def test_settling_the_heap_gives_mallocs_free_memory_back_and_keeps_what_lives() -> None:
    # 2 KB objects go to malloc, not Python's small-object allocator; one in 16 kept alive
    # scatters the freed space through malloc's heap, where it used to stay resident.
    blocks = [bytes(2000) + bytes([i % 251]) for i in range(20_000)]
    kept = blocks[::16]
    del blocks
    gc.collect()
    before = _rss_mib()
    settle_heap()
    after = _rss_mib()
    assert before - after >= 16, (before, after)  # ~37 MB were freed
    assert [b[-1] for b in kept] == [(i * 16) % 251 for i in range(len(kept))]
    assert gc.get_freeze_count() > 0


def test_settling_the_heap_makes_young_collections_rarer_and_never_more_frequent() -> None:
    thresholds = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython's defaults
        settle_heap()
        assert gc.get_threshold() == (cache_module.YOUNG_THRESHOLD, 10, 10)
        gc.set_threshold(50_000, 20, 30)  # a caller's own, higher: kept
        settle_heap()
        assert gc.get_threshold() == (50_000, 20, 30)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
