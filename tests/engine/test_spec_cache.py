"""orchestrator.engine.validate.SpecCache: a custom resource's spec parsed once per generation;
a new generation is parsed anew (never a stale spec), an object without one every time."""

from __future__ import annotations

from typing import Any

from orchestrator import api
from orchestrator.engine.validate import SpecCache


def _run(generation: int | None, floor: int, uid: str | None = "u-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "r", "namespace": "ns"}
    if uid is not None:
        meta["uid"] = uid
    if generation is not None:
        meta["generation"] = generation
    spec = {
        "requiredAvailableCount": floor,
        "opsEndpoint": {"endpoint": "127.0.0.1:9090", "insecure": True},
        "clusters": [{"id": f"c-{i}", "version": "1.29.4"} for i in range(4)],
    }
    return {"metadata": meta, "spec": spec}


def _floor(parsed: object) -> int:
    assert isinstance(parsed, api.UpdateRunSpec), parsed
    return parsed.required_available_count


def test_a_new_generation_is_parsed_anew() -> None:
    cache = SpecCache()
    assert _floor(cache.parse(api.UpdateRunSpec, _run(1, 1))) == 1
    assert _floor(cache.parse(api.UpdateRunSpec, _run(2, 3))) == 3
    # Another object (uid) of the same generation is its own.
    assert _floor(cache.parse(api.UpdateRunSpec, _run(2, 1, uid="u-2"))) == 1


def test_the_same_generation_is_the_same_spec() -> None:
    cache = SpecCache()
    first = cache.parse(api.UpdateRunSpec, _run(3, 1))
    # The apiserver changes a spec only with its generation: the same generation is the
    # parsed spec of before (kept, not parsed again).
    assert cache.parse(api.UpdateRunSpec, _run(3, 1)) is first


def test_without_uid_or_generation_every_parse_is_fresh() -> None:
    cache = SpecCache()
    assert _floor(cache.parse(api.UpdateRunSpec, _run(None, 1))) == 1
    assert _floor(cache.parse(api.UpdateRunSpec, _run(None, 3))) == 3
    assert _floor(cache.parse(api.UpdateRunSpec, _run(1, 3, uid=None))) == 3


def test_problems_are_a_fresh_list_each_time_and_the_cache_is_bounded() -> None:
    cache = SpecCache(size=2)
    bad = _run(1, 1)
    bad["spec"]["requiredAvailableCount"] = "many"
    problems = cache.parse(api.UpdateRunSpec, bad)
    assert isinstance(problems, list) and problems
    assert any("requiredAvailableCount" in str(p) for p in problems)
    problems.clear()
    again = cache.parse(api.UpdateRunSpec, bad)
    assert isinstance(again, list) and again
    for n in range(5):
        cache.parse(api.UpdateRunSpec, _run(n + 10, 1, uid=f"u-{n}"))
    assert len(cache._kept) == 2
