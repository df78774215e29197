"""The sim's RPC faults: injected error codes with details, UNAVAILABLE at a rate, hanging
RPCs; checked before each call (and after a mutation, for answers lost after the work)."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import grpc

from plugins.sdk import PluginError, Reason, Unavailable
from plugins.sim.config import HangRpc, RpcErrorFault

__all__ = ["InjectedError", "RpcFaults", "short_method"]

_DEFAULT_REASONS: dict[str, str] = {
    "UNAVAILABLE": Reason.PROVIDER_UNAVAILABLE,
    "ABORTED": Reason.OPERATION_IN_FLIGHT,
    "FAILED_PRECONDITION": Reason.FAILED_PRECONDITION,
    "DEADLINE_EXCEEDED": "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED": "RESOURCE_EXHAUSTED",
    "INTERNAL": Reason.INTERNAL,
    "NOT_FOUND": Reason.NOT_FOUND,
}


class InjectedError(PluginError):
    """An error the fault rpcErrors answers, with the code it names."""

    def __init__(self, rule: RpcErrorFault, method: str) -> None:
        message = rule.message or (
            f"simulated {rule.code} for {method} (fault rpcErrors)"
            + (": the request was carried out, the answer lost" if rule.after else "")
        )
        super().__init__(
            message,
            reason=rule.reason or _DEFAULT_REASONS[rule.code],
            retry_after=rule.retry_after,
            retryable=rule.retry_after is not None or rule.code == "UNAVAILABLE",
        )
        self.code = grpc.StatusCode[rule.code]


class RpcFaults:
    """UNAVAILABLE at a rate, hanging RPCs and injected error codes, checked at the start of
    each sim RPC (and, for rpcErrors with after, once a mutation was carried out)."""

    def __init__(
        self,
        rate: float,
        methods: Sequence[str],
        hangs: Sequence[HangRpc],
        seed: int | None,
        closing: threading.Event,
        errors: Sequence[RpcErrorFault] = (),
    ) -> None:
        self._rate = rate
        self._methods = frozenset(short_method(m) for m in methods)
        self._hangs = {short_method(h.method): h for h in hangs}
        self._hang_left: dict[str, int | None] = {short_method(h.method): h.times for h in hangs}
        self._errors = [
            (index, short_method(rule.method), rule) for index, rule in enumerate(errors)
        ]
        self._error_left: dict[int, int | None] = {i: r.times for i, _, r in self._errors}
        self._rng = random.Random(seed)
        self._closing = closing
        self._lock = threading.Lock()
        self.active = rate > 0 or bool(hangs) or any(not r.after for _, _, r in self._errors)
        self.active_after = any(r.after for _, _, r in self._errors)

    def before(self, method: str, context: grpc.ServicerContext) -> None:
        """Hangs and/or raises Unavailable as the faults say (method: e.g. "GetCluster")."""
        hang = self._hangs.get(method)
        if hang is not None and self._take_hang(method):
            self._hang(hang.seconds, context)
        self._inject(method, after=False)
        if self._rate > 0 and (not self._methods or method in self._methods):
            with self._lock:
                roll = self._rng.random()
            if roll < self._rate:
                raise Unavailable("simulated unavailability (fault unavailableRate); retry")

    def after(self, method: str) -> None:
        """Raises the rpcErrors answer of a mutation already carried out, if one applies."""
        if self.active_after:
            self._inject(method, after=True)

    def _inject(self, method: str, after: bool) -> None:
        for index, name, rule in self._errors:
            if name != method or rule.after != after:
                continue
            with self._lock:
                left = self._error_left[index]
                if left is not None and left <= 0:
                    continue
                if rule.rate < 1.0 and self._rng.random() >= rule.rate:
                    continue
                if left is not None:
                    self._error_left[index] = left - 1
            raise InjectedError(rule, method)

    def _take_hang(self, method: str) -> bool:
        with self._lock:
            left = self._hang_left[method]
            if left is None:
                return True
            if left <= 0:
                return False
            self._hang_left[method] = left - 1
            return True

    def _hang(self, seconds: float, context: grpc.ServicerContext) -> None:
        remaining = seconds
        step = 0.05
        while remaining > 0 and context.is_active() and not self._closing.is_set():
            self._closing.wait(min(step, remaining))
            remaining -= step


def short_method(method: str) -> str:
    """ "/pkg.ClusterService/GetCluster", "ClusterService/GetCluster" -> "GetCluster"."""
    return method.rstrip("/").rsplit("/", 1)[-1]
