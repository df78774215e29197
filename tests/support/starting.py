"""A driver Provider's requests started without a thread waiting on each
(orchestrator.pipeline.driver.StartsRequests, as the gRPC adapter starts them), for providers
written for tests: each request is made when started, and its answer (or CallError) handed over
when asked for. Counts how many were started and not yet asked for, and the most at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.engine.decide import Call, Preflight
from orchestrator.engine.observations import OpObs
from orchestrator.pipeline.driver import CallError

__all__ = ["BatchesAtOnce", "InlineExecutor", "StartsAtOnce"]

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


class BatchesAtOnce(StartsAtOnce):
    """StartsAtOnce that also starts many as one request (driver.StartsBatches, as the gRPC
    adapter's StartOperations and PreflightUpgrades): each item made in order when the batch
    is started, its answer handed over when asked for."""

    def start_calls(self, calls: Sequence[Call]) -> list[Callable[[], OpObs]] | None:
        return [self.start_call(call) for call in calls]

    def start_preflights(
        self, questions: Sequence[tuple[str, str, Mapping[str, str]]]
    ) -> list[Callable[[], Preflight]] | None:
        return [self.start_preflight(*q) for q in questions]


class InlineExecutor(Executor):
    """An Executor that runs each task when it is submitted, on the submitting thread: the
    driver's parallel pass (RunDriver.parallelism > 1: no stop at the first conflict, calls
    started and batched) in one deterministic order, the order of a pool whose first worker
    took every item before the others started."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed over as a pool's Future would
            done.set_exception(exc)
        return done
