"""The ClusterVersion kind: desired versions for a fleet; its status summarizes the current run."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator

from orchestrator.api.fields import Condition, OpsEndpoint, ProviderRef, Version, _Model
from orchestrator.api.rollout import (
    ClusterSpec,
    HealthChecks,
    Notification,
    RetrySpec,
    SkipSpec,
    StageStatus,
    StepTimeouts,
    Strategy,
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


class ClusterVersionSpec(_Model):
    """Desired versions for a fleet and how to get there."""

    required_available_count: int = Field(
        default=1, ge=1, description="Clusters available and in service never fall below this."
    )
    ops_endpoint: OpsEndpoint | None = Field(
        default=None,
        description="Inline plugin endpoint (only in namespaces the admin allows); "
        "or set providerRef.",
    )
    provider_ref: ProviderRef | None = Field(
        default=None, description="A FleetProvider that allows this namespace (not opsEndpoint)."
    )
    provider_refs: list[ProviderRef] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="Several FleetProviders, one run over all their clusters under one "
        "requiredAvailableCount (not with providerRef or opsEndpoint).",
    )
    version: Version | None = Field(
        default=None, description="Target for clusters selected by stages but not listed."
    )
    clusters: list[ClusterSpec] | None = None
    strategy: Strategy | None = None
    health_checks: HealthChecks | None = None
    timeouts: StepTimeouts | None = Field(
        default=None, description="Bounds on each kind of step (defaults in StepTimeouts)."
    )
    skip: SkipSpec | None = Field(default=None, description="Applies to the current run.")
    retry: RetrySpec | None = Field(default=None, description="Applies to the current run.")
    notifications: list[Notification] | None = None

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
