"""The rollout spec a ClusterVersion and an UpdateRun share (clusters, stages, strategy, health
checks, maintenance, hooks, notifications, timeouts) and the stage status both report."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.api.fields import (
    GROUP,
    NAME_PATTERN,
    TIME_OF_DAY_PATTERN,
    CheckInterval,
    IntOrPercent,
    LabelSelector,
    OpsEndpoint,
    ProviderRef,
    SecretKeyRef,
    SoakTime,
    SourceRef,
    StepTimeout,
    Timeout,
    TLSConfig,
    Version,
    WindowDuration,
    _Model,
)

__all__ = [
    "ANNOTATION_APPROVE_STAGES",
    "ANNOTATION_RETRY_CLUSTERS",
    "Approval",
    "CheckResult",
    "ClusterSpec",
    "FailedClusterPolicy",
    "HealthCheck",
    "HealthChecks",
    "HealthState",
    "Hook",
    "Hooks",
    "HttpHook",
    "JobHook",
    "Maintenance",
    "MaintenanceExclusion",
    "MaintenanceWindow",
    "MetricCheck",
    "MetricProvider",
    "NodePoolTarget",
    "Notification",
    "NotificationEvent",
    "NotificationType",
    "OnFailure",
    "ProviderWindows",
    "RetrySpec",
    "RolloutSpec",
    "SkipSpec",
    "Stage",
    "StagePhase",
    "StageStatus",
    "StepTimeouts",
    "Strategy",
    "ThresholdRange",
    "Weekday",
    "WorkloadRef",
    "WorkloadsCheck",
]


#: Comma-separated cluster ids whose Failed state the user clears: the next reconcile retries
#: them with a new request id (attempt + 1). Inert for clusters that are not Failed.
ANNOTATION_RETRY_CLUSTERS = f"{GROUP}/retry-clusters"


#: Comma-separated stage names approved to start (for stages with approval: Manual).
ANNOTATION_APPROVE_STAGES = f"{GROUP}/approve-stages"


class NodePoolTarget(_Model):
    """A node pool whose target version differs from the cluster's."""

    name: str = Field(min_length=1, max_length=128)
    version: Version


class ClusterSpec(_Model):
    """One cluster and the version it should run."""

    id: str = Field(min_length=1, max_length=512, description="The plugin's cluster id.")
    version: Version = Field(description="Target control-plane version.")
    node_version: Version | None = Field(
        default=None, description="Target for every node pool; defaults to version."
    )
    node_pools: list[NodePoolTarget] | None = Field(
        default=None, description="Per-pool targets overriding nodeVersion."
    )


class Approval(StrEnum):
    """Whether a stage starts by itself or waits for a person."""

    AUTOMATIC = "Automatic"
    MANUAL = "Manual"


class OnFailure(StrEnum):
    """What a failed cluster does to the rollout."""

    HALT = "Halt"
    CONTINUE = "Continue"


class ThresholdRange(_Model):
    """Bounds a metric value must stay within (inclusive); at least one is required."""

    min: float | None = None
    max: float | None = None


class MetricProvider(_Model):
    """Where a metric query runs."""

    type: str = Field(
        description="prometheus (HTTP query API) or plugin (HealthService.QueryMetric)."
    )
    address: str | None = Field(
        default=None, description="prometheus: base URL, e.g. http://prometheus.monitoring:9090."
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="prometheus: a Secret key holding a bearer token."
    )
    ca_secret_ref: SecretKeyRef | None = Field(
        default=None, description="prometheus: CA bundle for an https address."
    )
    insecure_skip_verify: bool = Field(default=False, description="prometheus: skip TLS checks.")
    endpoint: str | None = Field(
        default=None, description="plugin: host:port (defaults to spec.opsEndpoint.endpoint)."
    )
    insecure: bool | None = Field(default=None, description="plugin: plaintext gRPC.")
    tls: TLSConfig | None = Field(default=None, description="plugin: TLS as in opsEndpoint.")
    source_ref: SourceRef | None = Field(
        default=None,
        description="prometheus: a MetricSource instead of address (and its Secrets).",
    )


class MetricCheck(_Model):
    """A query whose single value must fall within thresholdRange."""

    provider: MetricProvider
    query: str = Field(
        min_length=1,
        description="Query text; {{ cluster }}, {{ stage }} and {{ labels.KEY }} are replaced.",
    )
    threshold_range: ThresholdRange
    no_data_policy: Literal["Fail", "Pass"] = Field(
        default="Fail", description="What a query with no data counts as."
    )


class WorkloadRef(_Model):
    """A workload on each member cluster."""

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    kind: str | None = None
    min_healthy_replicas: int | None = Field(default=None, ge=1)


class WorkloadsCheck(_Model):
    """Workloads that must be healthy, as a plugin's CheckWorkloads sees them."""

    endpoint: str | None = Field(
        default=None, description="Plugin host:port (defaults to spec.opsEndpoint.endpoint)."
    )
    insecure: bool | None = None
    tls: TLSConfig | None = None
    items: list[WorkloadRef] = Field(min_length=1)


class HealthCheck(_Model):
    """One check: a metric or a set of workloads."""

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    metric: MetricCheck | None = None
    workloads: WorkloadsCheck | None = None


class HealthChecks(_Model):
    """Analysis run before each service-in and at each stage boundary; every check must pass."""

    interval: CheckInterval = Field(default="30s", description="Time between evaluations.")
    success_threshold: int = Field(
        default=3, ge=1, description="Consecutive passing evaluations needed (the soak)."
    )
    failure_threshold: int = Field(
        default=3, ge=1, description="Failed evaluations after which the rollout halts."
    )
    timeout: Timeout = Field(
        default="15m", description="Longest time to wait for successThreshold passes."
    )
    checks: list[HealthCheck] = Field(min_length=1)


class Weekday(StrEnum):
    """A day of the week, as maintenance windows name them."""

    MONDAY = "Monday"
    TUESDAY = "Tuesday"
    WEDNESDAY = "Wednesday"
    THURSDAY = "Thursday"
    FRIDAY = "Friday"
    SATURDAY = "Saturday"
    SUNDAY = "Sunday"


class MaintenanceWindow(_Model):
    """A recurring window in which clusters may start (and should finish) their upgrade."""

    name: str | None = Field(default=None, max_length=63)
    days: list[Weekday] | None = Field(
        default=None,
        description="Days the window opens (unset: every day, or as rrule says).",
    )
    start: str = Field(
        pattern=TIME_OF_DAY_PATTERN,
        description="Local time of day the window opens, HH:MM (24 h) in timeZone.",
    )
    duration: WindowDuration = Field(description="How long the window stays open, e.g. 4h.")
    time_zone: str = Field(
        default="UTC", max_length=64, description="IANA time zone, e.g. Europe/Berlin."
    )
    rrule: str | None = Field(
        default=None,
        max_length=512,
        description="RFC 5545 RRULE (e.g. FREQ=MONTHLY;BYDAY=1SA) instead of days; each "
        "occurrence opens at start.",
    )


class MaintenanceExclusion(_Model):
    """A one-off interval in which no cluster starts an upgrade (a freeze)."""

    name: str | None = Field(default=None, max_length=63)
    start: str = Field(description="RFC 3339 time, e.g. 2026-12-20T00:00:00Z.")
    end: str = Field(description="RFC 3339 time, after start.")


class ProviderWindows(StrEnum):
    """Whether the provider's own windows (Cluster.maintenance_windows) are honoured."""

    OFF = "Off"
    WINDOWS = "Windows"
    WINDOWS_AND_EXCLUSIONS = "WindowsAndExclusions"


class Maintenance(_Model):
    """When clusters may start their upgrade: windows, exclusions and the provider's own."""

    windows: list[MaintenanceWindow] | None = Field(
        default=None, description="Open windows (unset: always open, save exclusions)."
    )
    exclusions: list[MaintenanceExclusion] | None = None
    provider_windows: ProviderWindows = Field(
        default=ProviderWindows.OFF,
        description="Honour the windows (and exclusions) the provider reports per cluster.",
    )
    expected_duration: WindowDuration = Field(
        default="1h",
        description="How long one cluster's upgrade takes: a cluster starts only when its "
        "window stays open that long.",
    )
    allow_overrun: bool = Field(
        default=False, description="Start whenever a window is open, even if it closes first."
    )


class HttpHook(_Model):
    """An HTTP call: POST of JSON {hook, run, namespace, cluster, currentVersion,
    targetVersion, attempt, id} with the header Idempotency-Key: id (one id per cluster, hook
    and attempt; never sent twice). 2xx passes; any other answer fails the cluster with its
    status and a body excerpt; redirects are not followed. Allowed only in namespaces where
    inline endpoints are."""

    url: str | None = Field(
        default=None, pattern=r"^https?://", description="Endpoint (or urlSecretRef)."
    )
    url_secret_ref: SecretKeyRef | None = Field(
        default=None, description="A Secret key holding the URL (for URLs with tokens)."
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="A Secret key holding a bearer token (Authorization header)."
    )
    ca_secret_ref: SecretKeyRef | None = Field(
        default=None, description="A Secret key holding the CA bundle (PEM) of an https URL."
    )
    timeout: Timeout = Field(default="30s", description="Per request.")
    retries: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Further tries on connection errors, timeouts and 5xx (exponential "
        "backoff), all within the hook's timeout.",
    )

    @model_validator(mode="after")
    def _one_url(self) -> HttpHook:
        if (self.url is None) == (self.url_secret_ref is None):
            raise ValueError("http: set exactly one of url and urlSecretRef")
        return self


class JobHook(_Model):
    """A Kubernetes Job created from a template in the run's namespace."""

    template: dict[str, Any] = Field(
        description="A batch/v1 JobSpec; its containers get CLUSTER_ID, CLUSTER_VERSION, "
        "TARGET_VERSION, HOOK, RUN and ATTEMPT as environment variables. The Job is named "
        "after the cluster, hook and attempt, owned by the ClusterUpgrade, its "
        "activeDeadlineSeconds at most the hook's timeout; ttlSecondsAfterFinished is dropped "
        "(a Job gone before its outcome was read would run again). Complete passes, Failed "
        "fails the cluster.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Hook(_Model):
    """One hook: an HTTP call or a Job (exactly one)."""

    http: HttpHook | None = None
    job: JobHook | None = None
    timeout: Timeout = Field(
        default="10m", description="Bound on the whole hook; past it the cluster fails."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Hook:
        if (self.http is None) == (self.job is None):
            raise ValueError("set exactly one of http and job")
        return self


class Hooks(_Model):
    """Per-cluster hooks: preUpgrade before the service-out, postUpgrade after the checks."""

    pre_upgrade: Hook | None = None
    post_upgrade: Hook | None = None


class FailedClusterPolicy(StrEnum):
    """What happens to a failed cluster while the rollout goes on."""

    #: It stays out of service for a person to look at.
    KEEP_OUT = "KeepOut"
    #: It is serviced back in when it is available and its pools ready.
    SERVICE_IN_IF_HEALTHY = "ServiceInIfHealthy"


class Stage(_Model):
    """A group of clusters upgraded together; stages run in order."""

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    clusters: list[str] | None = Field(default=None, description="Cluster ids.")
    selector: LabelSelector | None = Field(
        default=None, description="Label selector over the plugin's inventory."
    )
    max_concurrency: IntOrPercent | None = None
    soak_time: SoakTime | None = Field(
        default=None, description="Wait after the stage completes before the next starts."
    )
    approval: Approval = Approval.AUTOMATIC
    health_checks: HealthChecks | None = Field(
        default=None, description="Overrides spec.healthChecks for this stage."
    )
    max_failures: IntOrPercent | None = Field(
        default=None,
        description="Failed clusters this stage tolerates (count or percent of the stage).",
    )
    maintenance: Maintenance | None = Field(
        default=None, description="Overrides strategy.maintenance for this stage."
    )


class Strategy(_Model):
    """How the rollout proceeds."""

    stages: list[Stage] | None = None
    max_concurrency: IntOrPercent | None = Field(
        default=None, description="Clusters upgraded at once, capped by the availability budget."
    )
    paused: bool = Field(default=False, description="Start no new step while true.")
    on_failure: OnFailure = OnFailure.HALT
    max_failures: IntOrPercent | None = Field(
        default=None,
        description="Failed clusters the run tolerates (count or percent of the run) before it "
        "halts; unset: onFailure decides (Halt: 0, Continue: all).",
    )
    failed_cluster_policy: FailedClusterPolicy = FailedClusterPolicy.KEEP_OUT
    maintenance: Maintenance | None = None
    not_before: str | None = Field(
        default=None, description="RFC 3339 time before which no cluster starts."
    )
    hooks: Hooks | None = None


class SkipSpec(_Model):
    """Clusters and stages a person skipped (level-triggered: listed means skipped)."""

    clusters: list[str] | None = Field(default=None, description="Cluster ids.")
    stages: list[str] | None = Field(default=None, description="Stage names.")
    reason: str | None = Field(default=None, max_length=1024)
    requested_by: str | None = Field(default=None, max_length=253)


class RetrySpec(_Model):
    """Clusters to give a fresh attempt, once per round (raise round to retry again)."""

    clusters: list[str] = Field(min_length=1, description="Cluster ids.")
    round: int = Field(ge=1, description="Each listed cluster retries once per round.")
    reason: str | None = Field(default=None, max_length=1024)
    requested_by: str | None = Field(default=None, max_length=253)


class NotificationType(StrEnum):
    """The body a notification endpoint receives."""

    CLOUD_EVENTS = "CloudEvents"
    SLACK = "Slack"


class NotificationEvent(StrEnum):
    """What a notification can be sent for."""

    RUN_STARTED = "RunStarted"
    RUN_SUCCEEDED = "RunSucceeded"
    RUN_FAILED = "RunFailed"
    RUN_HALTED = "RunHalted"
    RUN_STOPPED = "RunStopped"
    STAGE_STARTED = "StageStarted"
    STAGE_COMPLETED = "StageCompleted"
    STAGE_FAILED = "StageFailed"
    APPROVAL_AWAITED = "ApprovalAwaited"
    CLUSTER_FAILED = "ClusterFailed"


class Notification(_Model):
    """An HTTP endpoint told of transitions (CloudEvents JSON or a Slack incoming webhook)."""

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    type: NotificationType = NotificationType.CLOUD_EVENTS
    url_secret_ref: SecretKeyRef = Field(description="A Secret key holding the endpoint URL.")
    bearer_token_secret_ref: SecretKeyRef | None = None
    ca_secret_ref: SecretKeyRef | None = None
    events: list[NotificationEvent] | None = Field(
        default=None, description="Only these (unset: all)."
    )


class StepTimeouts(_Model):
    """Bounds on each kind of step; a step that outlives its bound fails the cluster."""

    service_out: StepTimeout = Field(default="15m", description="ServiceOut operations.")
    control_plane: StepTimeout = Field(default="90m", description="Control-plane upgrades.")
    node_pool: StepTimeout = Field(
        default="90m",
        description="Each node-pool upgrade, plus the soak the provider reports for the pool "
        "(e.g. a GKE blue-green upgrade's batch and node-pool soaks).",
    )
    service_in: StepTimeout = Field(default="15m", description="ServiceIn operations.")
    ready: StepTimeout = Field(
        default="30m",
        description="Waiting for the cluster to become available and its pools ready.",
    )


class RolloutSpec(_Model):
    """The fields a ClusterVersion's spec and an UpdateRun's spec share, declared once.

    The two kinds subclass it and add their own fields: an UpdateRun puts `state` and
    `clusterVersionRef` first (a mixin listed after this class, so they come first in the
    schema). A kind that says more about a field than this (its description) declares that field
    again with the same type and default; the field keeps its place, so the CRDs keep their
    field order (`python -m orchestrator.api.crd` regenerates them byte for byte).
    """

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
    timeouts: StepTimeouts | None = None
    skip: SkipSpec | None = None
    retry: RetrySpec | None = None
    notifications: list[Notification] | None = None


class StagePhase(StrEnum):
    """Where one stage stands."""

    PENDING = "Pending"
    AWAITING_APPROVAL = "AwaitingApproval"
    PROGRESSING = "Progressing"
    VERIFYING = "Verifying"
    SOAKING = "Soaking"
    COMPLETED = "Completed"
    FAILED = "Failed"
    #: Skipped by a person: members not started are Skipped, members in flight finish.
    SKIPPED = "Skipped"


class CheckResult(_Model):
    """The last evaluation of one check."""

    name: str
    passed: bool
    value: float | None = None
    message: str | None = None


class HealthState(_Model):
    """Progress of the health analysis of a cluster (before service-in) or a stage."""

    passes: int = 0
    failures: int = 0
    since: str
    last_check_time: str | None = None
    results: list[CheckResult] | None = None


class StageStatus(_Model):
    """Summary of one stage."""

    name: str
    phase: StagePhase
    total: int
    upgraded: int = Field(description="Clusters upgraded (skipped ones are counted apart).")
    skipped: int = Field(
        default=0, description="Clusters skipped: by a person, at target already, or gone."
    )
    failed: int = Field(
        default=0,
        description="Clusters that count against the failure budget: Failed, or Blocked "
        "because the provider refuses their target.",
    )
    max_failures: int | None = Field(default=None, description="Failures this stage tolerates.")
    start_time: str | None = None
    completion_time: str | None = None
    health: HealthState | None = None
