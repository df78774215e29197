"""PreflightUpgrade verdicts: built directly, or derived from the refusal a mutation would raise."""

from __future__ import annotations

import math
from collections.abc import Callable

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.errors import Conflict, FailedPrecondition, PluginError, Reason

__all__ = [
    "accepted",
    "refused_later",
    "refused_never",
    "verdict_of",
    "verdict_of_check",
]


def accepted() -> cluster_pb2.PreflightUpgradeResponse:
    """The upgrade would be accepted now."""
    return cluster_pb2.PreflightUpgradeResponse(verdict=cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED)


def refused_later(
    reason_code: str, message: str, retry_after_seconds: float = 0.0
) -> cluster_pb2.PreflightUpgradeResponse:
    """Refused now, may be accepted later; retry_after_seconds 0 means unknown."""
    return cluster_pb2.PreflightUpgradeResponse(
        verdict=cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER,
        reason_code=str(reason_code),
        message=message,
        retry_after_seconds=max(0, math.ceil(retry_after_seconds)),
    )


def refused_never(reason_code: str, message: str) -> cluster_pb2.PreflightUpgradeResponse:
    """Never accepted as asked: the caller must change the target."""
    return cluster_pb2.PreflightUpgradeResponse(
        verdict=cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER,
        reason_code=str(reason_code),
        message=message,
    )


def verdict_of(error: PluginError) -> cluster_pb2.PreflightUpgradeResponse:
    """The verdict matching the refusal a mutating RPC would answer.

    A Conflict (another operation in flight) or a retryable FailedPrecondition is
    REFUSED_LATER; any other FailedPrecondition is REFUSED_NEVER. Other errors (NotFound,
    InvalidArgument, Unavailable...) are not verdicts: they are raised again, so PreflightUpgrade
    answers them as the same status code.
    """
    if isinstance(error, Conflict):
        return refused_later(Reason.CLUSTER_BUSY, error.message, error.retry_after or 0.0)
    if isinstance(error, FailedPrecondition):
        if error.retryable:
            return refused_later(error.reason, error.message, error.retry_after or 0.0)
        return refused_never(error.reason, error.message)
    raise error


def verdict_of_check(check: Callable[[], object]) -> cluster_pb2.PreflightUpgradeResponse:
    """Runs check (the mutating RPC's own refusal rules) and turns its outcome into a verdict.

    check returning means accepted; raising Conflict / FailedPrecondition means refused (see
    verdict_of); raising Unavailable or another PluginError answers that error.
    """
    try:
        check()
    except (Conflict, FailedPrecondition) as exc:
        return verdict_of(exc)
    return accepted()
