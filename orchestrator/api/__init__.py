"""The ClusterVersion API: typed models of spec and status, the one source of the CRD schema."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "ANNOTATION_APPROVE_STAGES",
    "ANNOTATION_RETRY_CLUSTERS",
    "ANNOTATION_SKIP_CLUSTERS",
    "API_VERSION",
    "CLUSTER_UPGRADE_KIND",
    "CLUSTER_UPGRADE_PLURAL",
    "FINALIZER",
    "FINISHED_PHASES",
    "FLEET_PROVIDER_KIND",
    "FLEET_PROVIDER_PLURAL",
    "GROUP",
    "KIND",
    "LABEL_CLUSTER_VERSION",
    "LABEL_RUN",
    "METRIC_SOURCE_KIND",
    "METRIC_SOURCE_PLURAL",
    "PLURAL",
    "UPDATE_RUN_KIND",
    "UPDATE_RUN_PLURAL",
    "VERSION",
    "AllowedNamespaces",
    "Approval",
    "CheckResult",
    "ClusterSpec",
    "ClusterUpgradeSpec",
    "ClusterUpgradeStatus",
    "ClusterVersionRef",
    "ClusterVersionSpec",
    "ClusterVersionStatus",
    "Condition",
    "FleetProviderSpec",
    "HealthCheck",
    "HealthChecks",
    "HealthState",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MetricCheck",
    "MetricProvider",
    "MetricSourceSpec",
    "NodePoolTarget",
    "OnFailure",
    "OpsEndpoint",
    "ProviderRef",
    "RolloutPhase",
    "RunCounts",
    "RunPhase",
    "RunRecord",
    "RunState",
    "SecretKeyRef",
    "SourceRef",
    "Stage",
    "StagePhase",
    "StageStatus",
    "StepTimeouts",
    "Strategy",
    "Summary",
    "TLSConfig",
    "ThresholdRange",
    "UpdateRunSpec",
    "UpdateRunStatus",
    "UpgradePhase",
    "WorkloadRef",
    "WorkloadsCheck",
    "parse_duration",
    "parse_max_concurrency",
    "parse_max_failures",
    "run_is_live",
]

GROUP = "multicluster-ops.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ClusterVersion"
PLURAL = "clusterversions"

#: Comma-separated cluster ids whose Failed state the user clears: the next reconcile retries
#: them with a new request id (attempt + 1). Inert for clusters that are not Failed.
ANNOTATION_RETRY_CLUSTERS = f"{GROUP}/retry-clusters"
#: Comma-separated stage names approved to start (for stages with approval: Manual).
ANNOTATION_APPROVE_STAGES = f"{GROUP}/approve-stages"

VERSION_PATTERN = r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+][0-9A-Za-z.+-]+)?$"
ENDPOINT_PATTERN = (
    r"^((\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):[0-9]{1,5}|unix:.+)$"
)
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_UNIT = r"(ms|s|m|h)"
#: A duration that is not zero (the CRD schema's pattern: the apiserver refuses 0s and -5s).
POSITIVE_DURATION_PATTERN = (
    rf"^(0+(\.0+)?{_UNIT})*"
    rf"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*){_UNIT}"
    rf"([0-9]+(\.[0-9]+)?{_UNIT})*$"
)
TIME_OF_DAY_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> timedelta:
    """Parse a Go-style duration such as "90s", "10m" or "1h30m"."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration; write it like 30s, 10m or 1h30m")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))
    return timedelta(seconds=seconds)


def _at_least(minimum: str, why: str) -> AfterValidator:
    """A duration field's one rule: a duration (no sign), and at least `minimum` (README's CRD
    reference lists each field's minimum). The CRD schema tells the apiserver "positive"
    (POSITIVE_DURATION_PATTERN); the minimum is said here, so the webhook, the controllers,
    `plan` and the simulation refuse the same values with the same words."""
    floor = parse_duration(minimum)

    def check(text: str) -> str:
        if not re.fullmatch(DURATION_PATTERN, text):
            raise ValueError(
                f"{text!r} is not a duration; write a positive one like 30s, 10m or 1h30m "
                "(no sign, units ms, s, m, h)"
            )
        if parse_duration(text) < floor:
            raise ValueError(f"{text} is too short: {why}; set it to {minimum} or more")
        return text

    return AfterValidator(check)


#: A duration field as the CRD schema says it (the minimum is `_at_least`'s).
_DURATION = Field(max_length=32, json_schema_extra={"pattern": POSITIVE_DURATION_PATTERN})

# The minimums (README "CRD reference"). Step start times are stamped in whole seconds, so a
# step bound is measured up to 1 s long: below 2 s a step could time out the moment it starts
# (a 0s bound failed every cluster it took out). Windows open at whole minutes (start: HH:MM).
#: timeouts.* (each step) and the wait for readiness.
StepTimeout = Annotated[
    str, _DURATION, _at_least("2s", "a step bound under 2s can end a step the moment it starts")
]
#: healthChecks.interval: the pace of evaluations.
CheckInterval = Annotated[
    str, _DURATION, _at_least("100ms", "evaluations closer than 100ms only load the backend")
]
#: healthChecks.timeout, a hook's timeout and an HTTP hook's per-request timeout.
Timeout = Annotated[
    str, _DURATION, _at_least("1s", "a bound under 1s ends a call before it can answer")
]
#: A stage's soakTime.
SoakTime = Annotated[str, _DURATION, _at_least("1s", "to soak for no time, leave soakTime out")]
#: A maintenance window's duration and expectedDuration.
WindowDuration = Annotated[
    str, _DURATION, _at_least("1m", "maintenance windows are scheduled in whole minutes")
]


# Label keys and values as Kubernetes accepts them: the rules mirror
# k8s.io/apimachinery/pkg/util/validation/validation.go (IsQualifiedName, IsValidLabelValue),
# applied as k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go
# (ValidateLabelSelector, ValidateLabelSelectorRequirement) and pkg/labels/selector.go
# (NewRequirement, which also checks the values of In / NotIn) apply them to a LabelSelector.
_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY_PATTERN = rf"^({_DNS_SUBDOMAIN}/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a label key Kubernetes accepts (a qualified name), or None."""
    prefix = key.rpartition("/")[0]
    if "/" in prefix:
        return f"{key!r} has more than one '/'; write [prefix/]name, e.g. example.com/ring"
    if not re.fullmatch(LABEL_KEY_PATTERN, key):
        return (
            f"{key!r} is not a label key: a name of at most 63 letters, digits, '-', '_' or '.' "
            "starting and ending with a letter or digit, with an optional DNS prefix and '/' "
            "(e.g. ring or example.com/ring)"
        )
    if len(prefix) > 253:
        return f"{key!r} has a prefix longer than 253 characters; shorten it"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a label value Kubernetes accepts, or None."""
    if len(value) > 63 or not re.fullmatch(LABEL_VALUE_PATTERN, value):
        return (
            f"{value!r} is not a label value: at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit (or empty)"
        )
    return None


def _label_value(value: str) -> str:
    problem = label_value_problem(value)
    if problem:
        raise ValueError(problem)
    return value


LabelValue = Annotated[
    str,
    Field(max_length=63, json_schema_extra={"pattern": LABEL_VALUE_PATTERN}),
    AfterValidator(_label_value),
]


def parse_max_concurrency(value: int | str, total: int) -> int:
    """Resolve a count or "N%" against total: percent rounds down, at least 1."""
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} must be at least 1")
        return value
    match = re.fullmatch(r"([0-9]{1,3})%", value.strip())
    if not match or not 1 <= int(match.group(1)) <= 100:
        raise ValueError(f"{value!r} must be a count such as 3 or a percentage such as 25%")
    return max(1, total * int(match.group(1)) // 100)


def parse_max_failures(value: int | str, total: int) -> int:
    """Resolve a failure budget, a count or "N%" of total: percent rounds down and may be 0."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} must be at least 0")
        return value
    match = re.fullmatch(r"([0-9]{1,3})%", value.strip())
    if not match or not 0 <= int(match.group(1)) <= 100:
        raise ValueError(f"{value!r} must be a count such as 3 or a percentage such as 10%")
    return total * int(match.group(1)) // 100


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    def dump(self) -> dict[str, Any]:
        """The object as Kubernetes JSON (camelCase, unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


Version = Annotated[str, Field(pattern=VERSION_PATTERN, max_length=64)]
IntOrPercent = Annotated[
    int | str,
    Field(description='A count (3) or a percentage of the stage\'s clusters ("25%").'),
]


class SecretKeyRef(_Model):
    """A key of a Secret in the ClusterVersion's namespace."""

    name: str = Field(min_length=1, max_length=253)
    key: str = Field(min_length=1, max_length=253)


class TLSConfig(_Model):
    """TLS settings for the plugin endpoint; certificates come from Secrets, never from spec."""

    ca_secret_ref: SecretKeyRef | None = Field(
        default=None, description="CA bundle that signed the plugin's certificate."
    )
    client_secret_name: str | None = Field(
        default=None,
        max_length=253,
        description="A kubernetes.io/tls Secret (tls.crt, tls.key) presented for mTLS.",
    )
    server_name: str | None = Field(default=None, description="Override for the TLS server name.")


class OpsEndpoint(_Model):
    """Where the provider plugin listens (the original operator's opsEndpoint)."""

    endpoint: str = Field(pattern=ENDPOINT_PATTERN, description="host:port or unix:/path.")
    insecure: bool = Field(default=False, description="true: plaintext gRPC; false: TLS.")
    tls: TLSConfig | None = None


class ProviderRef(_Model):
    """A FleetProvider (cluster-scoped) by name: the plugin a platform admin declared."""

    name: str = Field(min_length=1, max_length=253)


class SourceRef(_Model):
    """A MetricSource (cluster-scoped) by name: the Prometheus a platform admin declared."""

    name: str = Field(min_length=1, max_length=253)


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


class LabelSelectorRequirement(_Model):
    """A metav1.LabelSelectorRequirement, refused where Kubernetes refuses it."""

    key: str = Field(min_length=1, max_length=317, json_schema_extra={"pattern": LABEL_KEY_PATTERN})
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] | None = Field(
        default=None,
        validate_default=True,
        description="Non-empty for In and NotIn; unset or empty for Exists and DoesNotExist.",
    )

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        problem = label_key_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("values")
    @classmethod
    def _values(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        # ValidateLabelSelectorRequirement: In / NotIn need values, Exists / DoesNotExist none.
        operator = info.data.get("operator")
        if operator in ("In", "NotIn") and not value:
            raise ValueError(
                f"must list at least one value when operator is {operator} (it would select "
                "nothing); list the label values, or use Exists to match any value"
            )
        if operator in ("Exists", "DoesNotExist") and value:
            raise ValueError(
                f"must be empty when operator is {operator}; remove values, or use In / NotIn "
                "to match them"
            )
        return value


class LabelSelector(_Model):
    """A metav1.LabelSelector over the plugin inventory's labels."""

    match_labels: dict[str, LabelValue] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None

    @field_validator("match_labels")
    @classmethod
    def _label_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            problem = label_key_problem(key)
            if problem:
                raise ValueError(problem)
        return value

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when labels satisfy every term (an empty selector matches everything)."""
        for key, value in (self.match_labels or {}).items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions or []:
            present = req.key in labels
            values = req.values or []
            if req.operator == "In" and (not present or labels[req.key] not in values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


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
    node_pool: StepTimeout = Field(default="90m", description="Each node-pool upgrade.")
    service_in: StepTimeout = Field(default="15m", description="ServiceIn operations.")
    ready: StepTimeout = Field(
        default="30m",
        description="Waiting for the cluster to become available and its pools ready.",
    )


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


class Condition(_Model):
    """A metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str


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
    upgraded: int
    failed: int = 0
    max_failures: int | None = Field(default=None, description="Failures this stage tolerates.")
    start_time: str | None = None
    completion_time: str | None = None
    health: HealthState | None = None


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


# --- UpdateRun and ClusterUpgrade (DESIGN.md "Rollout objects") --------------------------------

UPDATE_RUN_KIND = "UpdateRun"
UPDATE_RUN_PLURAL = "updateruns"
CLUSTER_UPGRADE_KIND = "ClusterUpgrade"
CLUSTER_UPGRADE_PLURAL = "clusterupgrades"
#: Label on every ClusterUpgrade: the name of its UpdateRun.
LABEL_RUN = f"{GROUP}/update-run"
#: Label on every UpdateRun a ClusterVersion created: the ClusterVersion's name.
LABEL_CLUSTER_VERSION = f"{GROUP}/cluster-version"
#: The finalizer on every ClusterVersion, UpdateRun and ClusterUpgrade: deleting one is an
#: operation that brings back into service what its run took out before the object goes
#: (orchestrator.pipeline.deletion; docs/operations.md "What deleting a rollout does").
FINALIZER = f"{GROUP}/back-in-service"
#: Comma-separated cluster ids of an UpdateRun to skip (recorded on their ClusterUpgrade).
ANNOTATION_SKIP_CLUSTERS = f"{GROUP}/skip-clusters"
#: Comma-separated stage names of an UpdateRun to skip (level-triggered, like approve-stages):
#: members not started are Skipped, members in flight finish their step.
ANNOTATION_SKIP_STAGES = f"{GROUP}/skip-stages"
#: Free text recorded with the skips and retries the same write asks for.
ANNOTATION_REASON = f"{GROUP}/reason"
#: Who asked (the CLI writes the kubeconfig user); recorded with the skips and retries.
ANNOTATION_REQUESTED_BY = f"{GROUP}/requested-by"


class RunState(StrEnum):
    """What a person wants an UpdateRun to do."""

    RUN = "Run"
    #: Admit no new cluster; clusters in flight finish their step and are serviced back in.
    STOP = "Stop"


class UpgradePhase(StrEnum):
    """Where one ClusterUpgrade stands (DESIGN.md per-cluster lifecycle)."""

    PENDING = "Pending"
    #: The preUpgrade hook runs (the cluster is held, still in service).
    PRE_HOOK = "PreUpgradeHook"
    SERVICING_OUT = "ServicingOut"
    UPGRADING_CONTROL_PLANE = "UpgradingControlPlane"
    UPGRADING_NODE_POOLS = "UpgradingNodePools"
    VERIFYING = "Verifying"
    #: The postUpgrade hook runs (after the checks passed, before the service-in).
    POST_HOOK = "PostUpgradeHook"
    SERVICING_IN = "ServicingIn"
    UPGRADED = "Upgraded"
    FAILED = "Failed"
    #: Not started, with the reason (the provider refused, a claim is held elsewhere...).
    BLOCKED = "Blocked"
    #: Not upgraded by this run: already at target, gone from the inventory, skipped by a person.
    SKIPPED = "Skipped"


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


class ClusterUpgradeSpec(_Model):
    """The pinned intent for one cluster in one run."""

    cluster_id: str = Field(min_length=1, max_length=512)
    stage: str = Field(min_length=1, max_length=63)
    stage_index: int = Field(ge=0)
    version: Version
    node_version: Version
    node_pools: list[NodePoolTarget] | None = None
    provider: str = Field(
        min_length=1, description="The plugin endpoint the run reached the cluster through."
    )
    provider_id: str | None = Field(
        default=None,
        max_length=512,
        description="The identity of the provider the cluster belongs to (its plugin's name and "
        "GetPluginInfo fleet_id): clusters are (providerId, clusterId) wherever runs meet.",
    )

    def pool_target(self, pool: str) -> str:
        """The target version of a node pool."""
        for p in self.node_pools or []:
            if p.name == pool:
                return p.version
        return self.node_version


class HookPhase(StrEnum):
    """Where one hook run stands."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class HookStatus(_Model):
    """One hook run, recorded before it starts (never run twice for one attempt)."""

    kind: Literal["preUpgrade", "postUpgrade"]
    #: Job name, or the idempotency key sent with the HTTP call.
    id: str
    phase: HookPhase = HookPhase.RUNNING
    start_time: str
    message: str | None = None


class ClusterUpgradeStatus(_Model):
    """One cluster's progress; nothing here is ever compacted away."""

    phase: UpgradePhase = UpgradePhase.PENDING
    step: str | None = Field(default=None, description="The step in flight, e.g. nodePool/a.")
    request_id: str | None = None
    operation_id: str | None = None
    attempt: int = 0
    step_start_time: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None
    health: HealthState | None = None
    hook: HookStatus | None = Field(default=None, description="The hook of this attempt.")
    retry_round: int = Field(default=0, description="The last spec.retry.round applied.")
    conditions: list[Condition] | None = None


# --- Who may do what (DESIGN.md): providers and metric sources platform admins declare ---------

FLEET_PROVIDER_KIND = "FleetProvider"
FLEET_PROVIDER_PLURAL = "fleetproviders"
METRIC_SOURCE_KIND = "MetricSource"
METRIC_SOURCE_PLURAL = "metricsources"


class AllowedNamespaces(_Model):
    """The namespaces whose ClusterVersions and UpdateRuns may use a provider or source."""

    names: list[str] | None = Field(default=None, description="Namespaces by name.")
    selector: LabelSelector | None = Field(
        default=None,
        description="Namespaces whose labels match (an empty selector matches every namespace).",
    )

    def allows(self, namespace: str, labels: Mapping[str, str] | None) -> bool:
        """True when namespace is listed, or its labels (None: unknown) match the selector."""
        if namespace in (self.names or []):
            return True
        return self.selector is not None and labels is not None and self.selector.matches(labels)


class FleetProviderSpec(_Model):
    """A provider plugin a platform admin declares, and the namespaces that may use it."""

    endpoint: str = Field(pattern=ENDPOINT_PATTERN, description="host:port or unix:/path.")
    insecure: bool = Field(default=False, description="true: plaintext gRPC; false: TLS.")
    tls: TLSConfig | None = Field(
        default=None, description="TLS; its Secrets are read in the orchestrator's namespace."
    )
    allowed_namespaces: AllowedNamespaces = Field(
        description="Who may name this provider in spec.providerRef (nobody when empty)."
    )


class MetricSourceSpec(_Model):
    """A Prometheus a platform admin declares, and the namespaces whose checks may query it."""

    address: str = Field(
        pattern=r"^https?://[^/\s]+",
        max_length=2048,
        description="Base URL, e.g. http://prometheus.monitoring:9090.",
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="A bearer token (Secret in the orchestrator's namespace)."
    )
    ca_secret_ref: SecretKeyRef | None = Field(
        default=None, description="CA bundle for https (Secret in the orchestrator's namespace)."
    )
    insecure_skip_verify: bool = Field(default=False, description="Skip TLS verification.")
    allowed_namespaces: AllowedNamespaces = Field(
        description="Who may name this source in metric.provider.sourceRef (nobody when empty)."
    )
