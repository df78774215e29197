"""The ClusterVersion kind: desired versions for a fleet; its status summarizes the current run."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator

from orchestrator.api.fields import Condition, _Model
from orchestrator.api.rollout import (
    ClusterSpec,
    RetrySpec,
    RolloutSpec,
    SkipSpec,
    StageStatus,
    StepTimeouts,
)

__all__ = [
    "KIND",
    "PLURAL",
    "ClusterVersionSpec",
    "ClusterVersionStatus",
    "RolloutPhase",
    "RunRecord",
    "Summary",
]


KIND = "ClusterVersion"


PLURAL = "clusterversions"


class ClusterVersionSpec(RolloutSpec):
    """Desired versions for a fleet and how to get there."""

    timeouts: StepTimeouts | None = Field(
        default=None, description="Bounds on each kind of step (defaults in StepTimeouts)."
    )
    skip: SkipSpec | None = Field(default=None, description="Applies to the current run.")
    retry: RetrySpec | None = Field(default=None, description="Applies to the current run.")

    @field_validator("clusters")
    @classmethod
    def _unique_ids(cls, value: list[ClusterSpec] | None) -> list[ClusterSpec] | None:
        seen: set[str] = set()
        for index, cluster in enumerate(value or []):
            if cluster.id in seen:
                raise ValueError(
                    f"clusters[{index}].id: {cluster.id!r} is listed twice; list each cluster once"
                )
            seen.add(cluster.id)
        return value


class RolloutPhase(StrEnum):
    """Where the whole rollout stands."""

    PENDING = "Pending"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    HALTED = "Halted"
    COMPLETED = "Completed"
    #: Every stage is done but some clusters failed (onFailure: Continue).
    FAILED = "Failed"
    INVALID = "Invalid"


class Summary(_Model):
    """Counts over the whole fleet of this ClusterVersion."""

    total: int = 0
    up_to_date: int = 0
    in_flight: int = 0
    failed: int = 0
    available_in_service: int = 0
    by_phase: dict[str, int] | None = None


class RunRecord(_Model):
    """One UpdateRun of a ClusterVersion, as its history lists it."""

    name: str
    phase: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    message: str | None = None


class ClusterVersionStatus(_Model):
    """The current run's summary and the recent runs; small at any fleet size.

    Per-cluster progress lives on ClusterUpgrade objects (`kubectl get clusterupgrades -l
    multicluster-ops.io/update-run=RUN`).
    """

    observed_generation: int | None = None
    phase: RolloutPhase | None = None
    message: str | None = None
    current_run: str | None = None
    current_stage: str | None = None
    summary: Summary | None = None
    stages: list[StageStatus] | None = None
    runs: list[RunRecord] | None = Field(
        default=None, description="Recent runs, newest first (bounded by --run-history)."
    )
    conditions: list[Condition] | None = None
