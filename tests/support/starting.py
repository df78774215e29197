"""A driver Provider's requests started without a thread waiting on each
(orchestrator.pipeline.driver.StartsRequests, as the gRPC adapter starts them), for providers
written for tests: each request is made when started, and its answer (or CallError) handed over
when asked for. Counts how many were started and not yet asked for, and the most at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from orchestrator.engine.decide import Call, Preflight
from orchestrator.engine.observations import OpObs
from orchestrator.pipeline.driver import CallError

__all__ = ["StartsAtOnce"]

T = TypeVar("T")


class StartsAtOnce:
    """Mixin over a class with the blocking `preflight` and `call` of driver.Provider."""

    outstanding: int = 0
    most_outstanding: int = 0

    if TYPE_CHECKING:  # the class it is mixed into has them (first in its MRO: this one)

        def preflight(
            self, cluster_id: str, version: str, pools: Mapping[str, str]
        ) -> Preflight: ...

        def call(self, call: Call) -> OpObs: ...

    def _started(self, answer: Callable[[], T]) -> Callable[[], T]:
        try:
            value, error = answer(), None
        except CallError as err:
            error = err
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)

        def result() -> T:
            self.outstanding -= 1
            if error is not None:
                raise error
            return value

        return result

    def start_preflight(
        self, cluster_id: str, version: str, pools: Mapping[str, str]
    ) -> Callable[[], Preflight]:
        return self._started(lambda: self.preflight(cluster_id, version, pools))

    def start_call(self, call: Call) -> Callable[[], OpObs]:
        return self._started(lambda: self.call(call))
