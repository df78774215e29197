"""The cache keeps one copy of metadata values many objects hold equal (issue 21 item 3: every
ClusterUpgrade of a run has the same run label, finalizer and owner), and an object's own
values stay its own."""

from __future__ import annotations

from typing import Any

import orjson

from orchestrator import api
from orchestrator.adapters.cache import ObjectCache


def _wire(name: str, run: str, rv: int, extra_label: str | None = None) -> dict[str, Any]:
    labels = {api.LABEL_RUN: run}
    if extra_label:
        labels["cluster"] = extra_label
    obj = {
        "apiVersion": api.API_VERSION,
        "kind": api.CLUSTER_UPGRADE_KIND,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": labels,
            "finalizers": [api.FINALIZER],
            "ownerReferences": [
                {"apiVersion": api.API_VERSION, "kind": "UpdateRun", "name": run, "uid": run}
            ],
            "managedFields": [{"manager": "fleet-orchestrator"}],
        },
        "spec": {"clusterId": name},
    }
    return orjson.loads(orjson.dumps(obj))  # as decoded from the wire: no shared parts


def _cache() -> ObjectCache:
    return ObjectCache(None, api.CLUSTER_UPGRADE_PLURAL, None, index_label=api.LABEL_RUN)  # type: ignore[arg-type]


def test_equal_labels_finalizers_and_owners_are_one_object_across_cached_objects() -> None:
    cache = _cache()
    for i in range(3):
        cache.put(_wire(f"c{i}", "run-a", 10 + i))
    cache.put(_wire("other", "run-b", 20))
    metas = [cache.get("ns", f"c{i}")["metadata"] for i in range(3)]  # type: ignore[index]
    for part in ("labels", "finalizers", "ownerReferences"):
        assert all(m[part] is metas[0][part] for m in metas), part
    assert metas[0]["labels"] == {api.LABEL_RUN: "run-a"}
    assert metas[0]["ownerReferences"][0]["name"] == "run-a"
    other = cache.get("ns", "other")["metadata"]  # type: ignore[index]
    assert other["labels"] == {api.LABEL_RUN: "run-b"}
    assert other["ownerReferences"][0]["name"] == "run-b"
    assert other["finalizers"] is metas[0]["finalizers"]  # the same finalizer list
    assert {o["metadata"]["name"] for o in cache.by_label("ns", "run-a")} == {"c0", "c1", "c2"}


def test_a_newer_version_with_other_labels_changes_that_object_alone() -> None:
    cache = _cache()
    cache.put(_wire("c0", "run-a", 10))
    cache.put(_wire("c1", "run-a", 11))
    cache.put(_wire("c1", "run-a", 12, extra_label="c1"))
    assert cache.get("ns", "c1")["metadata"]["labels"] == {  # type: ignore[index]
        api.LABEL_RUN: "run-a",
        "cluster": "c1",
    }
    assert cache.get("ns", "c0")["metadata"]["labels"] == {api.LABEL_RUN: "run-a"}  # type: ignore[index]
    assert {o["metadata"]["name"] for o in cache.by_label("ns", "run-a")} == {"c0", "c1"}
