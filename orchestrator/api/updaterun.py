"""The UpdateRun kind: one rollout, its targets and strategy pinned when it starts."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from orchestrator.api.fields import GROUP, Condition, OpsEndpoint, ProviderRef, Version, _Model
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
    "ANNOTATION_REASON",
    "ANNOTATION_REQUESTED_BY",
    "ANNOTATION_SKIP_CLUSTERS",
    "ANNOTATION_SKIP_STAGES",
    "FINISHED_PHASES",
    "LABEL_CLUSTER_VERSION",
    "UPDATE_RUN_KIND",
    "UPDATE_RUN_PLURAL",
    "ClusterVersionRef",
    "FailureSummary",
    "RunCounts",
    "RunPhase",
    "RunState",
    "UpdateRunSpec",
    "UpdateRunStatus",
    "run_is_live",
]


UPDATE_RUN_KIND = "UpdateRun"


UPDATE_RUN_PLURAL = "updateruns"


#: Label on every UpdateRun a ClusterVersion created: the ClusterVersion's name.
LABEL_CLUSTER_VERSION = f"{GROUP}/cluster-version"


#: Comma-separated cluster ids of an UpdateRun to skip (recorded on their ClusterUpgrade).
ANNOTATION_SKIP_CLUSTERS = f"{GROUP}/skip-clusters"


#: Comma-separated stage names of an UpdateRun to skip (level-triggered, like approve-stages):
#: members not started are Skipped, members in flight finish their step.
ANNOTATION_SKIP_STAGES = f"{GROUP}/skip-stages"


#: Free text recorded with the skips and retries the same write asks for.
ANNOTATION_REASON = f"{GROUP}/reason"


#: Who says they asked: a display name anyone may type (the CLI's --requested-by, else the
#: kubeconfig user); recorded beside the authenticated user, never as it.
ANNOTATION_REQUESTED_BY = f"{GROUP}/requested-by"


#: The authenticated user (AdmissionRequest userInfo.username) of the last request that changed
#: the spec or a people annotation; only the mutating webhook sets it (it overwrites what a
#: writer typed). With ANNOTATION_REQUESTED_BY_GROUPS and ANNOTATION_REQUESTED_BY_STAMP.
ANNOTATION_REQUESTED_BY_USER = f"{GROUP}/requested-by-user"


#: That user's groups (comma-separated, system:authenticated left out).
ANNOTATION_REQUESTED_BY_GROUPS = f"{GROUP}/requested-by-groups"


#: A digest of the spec and people annotations the webhook vouched for: when they changed
#: since (written while the webhook was down), the user no longer speaks for them.
ANNOTATION_REQUESTED_BY_STAMP = f"{GROUP}/requested-by-stamp"


class RunState(StrEnum):
    """What a person wants an UpdateRun to do."""

    RUN = "Run"
    #: Admit no new cluster; clusters in flight finish their step and are serviced back in.
    STOP = "Stop"


class ClusterVersionRef(_Model):
    """The ClusterVersion (same namespace) an UpdateRun was created for."""

    name: str = Field(min_length=1, max_length=253)
    generation: int = Field(ge=1, description="The ClusterVersion generation the run pins.")


class UpdateRunSpec(_Model):
    """One rollout: its targets and strategy are pinned when it starts."""

    state: RunState = Field(default=RunState.RUN, description="Run, or Stop to wind it down.")
    cluster_version_ref: ClusterVersionRef | None = Field(
        default=None, description="Set when a ClusterVersion created this run."
    )
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
    clusters: list[ClusterSpec] | None = Field(
        default=None, description="Clusters by id (empty when a ClusterVersion pins them)."
    )
    strategy: Strategy | None = None
    health_checks: HealthChecks | None = None
    timeouts: StepTimeouts | None = None
    skip: SkipSpec | None = None
    retry: RetrySpec | None = None
    notifications: list[Notification] | None = None


class RunCounts(_Model):
    """ClusterUpgrades of a run by outcome (the run never lists every cluster)."""

    total: int = 0
    pending: int = 0
    in_flight: int = 0
    upgraded: int = 0
    failed: int = 0
    blocked: int = 0
    skipped: int = 0


class FailureSummary(_Model):
    """Failures against the run's budget, with the first few clusters and why."""

    count: int = 0
    max_failures: int | None = Field(default=None, description="Unset: no limit.")
    clusters: list[str] | None = Field(
        default=None, description="Up to 20 failed cluster ids (kubectl get cu for all)."
    )


class RunPhase(StrEnum):
    """Where an UpdateRun stands."""

    INITIALIZING = "Initializing"
    PROGRESSING = "Progressing"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    HALTED = "Halted"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"


#: The phases of a run that has ended: it admits nothing, holds nothing, and its floor binds no
#: other run; it moves again only when a person edits it (resume, a retry round). Every other
#: phase is live, Invalid included (clusters it took out may still be out, and fixing the spec
#: resumes it). The one definition: the controllers, the driver and the simulation use it.
FINISHED_PHASES = frozenset({RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.STOPPED})


def run_is_live(phase: RunPhase | str | None) -> bool:
    """Whether a run in this phase is live (None: not started yet, which is live)."""
    return phase not in FINISHED_PHASES


class UpdateRunStatus(_Model):
    """Counts, per-stage summaries and the outcome; small at any fleet size."""

    observed_generation: int | None = None
    phase: RunPhase | None = None
    message: str | None = None
    current_stage: str | None = None
    cluster_set_digest: str | None = Field(
        default=None, description="sha256 of the pinned cluster ids and targets."
    )
    counts: RunCounts | None = None
    stages: list[StageStatus] | None = None
    failures: FailureSummary | None = None
    next_start_time: str | None = Field(
        default=None, description="When the next cluster can start, if it waits for time."
    )
    waiting_reason: str | None = Field(
        default=None, description="Why no cluster starts now (window, notBefore, budget...)."
    )
    start_time: str | None = None
    end_time: str | None = None
    conditions: list[Condition] | None = None
