"""A memo bounded by emptying it whole when full: the one home of the pattern the hot paths
share (adapters.cache's shared metadata parts, engine.windows' spec keys and closed stretches).

Where the value is a pure function of hashable arguments, `functools.lru_cache` is the tool
(engine.conditions, api.fields, adapters.kept). This is for what it does not fit: a value
stored after the caller worked it out (the caller keeps what is stored, `keep`), a value
learnt in steps (the stretch known closed grows, `put`). Emptying whole costs nothing per hit
(no recency to keep) and re-learning what was dropped costs what one miss costs.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["BoundedMemo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """At most `limit` entries; a put into a full memo empties it first."""

    __slots__ = ("_limit", "_values")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"BoundedMemo: limit must be at least 1, not {limit}")
        self._limit = limit
        self._values: dict[K, V] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: K) -> V | None:
        """The value remembered for key, or None."""
        return self._values.get(key)

    def put(self, key: K, value: V) -> None:
        """Remember value for key (replacing what was)."""
        values = self._values
        if key not in values and len(values) >= self._limit:
            values.clear()
        values[key] = value

    def keep(self, key: K, value: V) -> V:
        """The value already remembered for key, else value, remembered now: equal values
        found through one key end up as one object."""
        known = self._values.get(key)
        if known is None:
            self.put(key, value)
            return value
        return known

    def clear(self) -> None:
        """Forget everything."""
        self._values.clear()
