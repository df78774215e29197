"""engine.memo.BoundedMemo: never more than its limit, emptied whole when full, one object per
equal value through `keep`; and the memos that use it stay bounded."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator import api
from orchestrator.adapters import cache
from orchestrator.engine import windows
from orchestrator.engine.memo import BoundedMemo


def test_a_put_into_a_full_memo_empties_it_first() -> None:
    memo: BoundedMemo[int, str] = BoundedMemo(3)
    for i in range(3):
        memo.put(i, str(i))
    assert len(memo) == 3 and memo.get(2) == "2"
    memo.put(1, "one")  # replacing what is there needs no room
    assert len(memo) == 3 and memo.get(1) == "one"
    memo.put(3, "3")
    assert len(memo) == 1
    assert [memo.get(i) for i in range(4)] == [None, None, None, "3"]


def test_keep_hands_back_the_first_equal_value_remembered() -> None:
    memo: BoundedMemo[str, list[str]] = BoundedMemo(2)
    first, second = ["a"], ["a"]
    assert memo.keep("k", first) is first
    assert memo.keep("k", second) is first
    memo.put("x", ["x"])
    memo.put("y", ["y"])  # full: emptied, so the next keep starts again
    assert memo.keep("k", second) is second


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be at least 1, not 0"):
        BoundedMemo[int, int](0)


def test_the_shared_metadata_parts_stay_bounded_and_shared() -> None:
    cache._shared_parts.clear()
    a = {"labels": {"run": "r1"}, "finalizers": ["f"]}
    b = {"labels": {"run": "r1"}, "finalizers": ["f"]}
    cache._share_parts(a)
    cache._share_parts(b)
    assert a["labels"] is b["labels"] and a["finalizers"] is b["finalizers"]
    for i in range(5000):
        cache._share_parts({"labels": {"run": f"r{i}"}})
    assert len(cache._shared_parts) <= 4096


def test_the_windows_memos_stay_bounded() -> None:
    now = datetime(2026, 11, 28, 12, tzinfo=UTC)
    for i in range(300):
        m = api.Maintenance.model_validate(
            {"windows": [{"start": f"{i % 24:02d}:00", "duration": "2h", "days": ["Monday"]}]}
        )
        windows.gate(m, (), now)
    assert len(windows._BY_ID) <= 256
    assert 0 < len(windows._CLOSED) <= 16384
