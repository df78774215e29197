"""The simulated fleet's YAML file: schema, validation with field paths, and generated fleets."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.sdk import is_newer_version, parse_version, read_yaml, validate_model

__all__ = [
    "FAULTABLE_METHODS",
    "STEP_KINDS",
    "AvailabilityFlap",
    "ClusterSpec",
    "ConfigError",
    "Defaults",
    "FailStep",
    "Faults",
    "FleetConfig",
    "ForgetStep",
    "GenerateSpec",
    "HangRpc",
    "HangStep",
    "MaintenanceWindowSpec",
    "NodePoolSpec",
    "OutOfBandUpgrade",
    "RefuseVersions",
    "RpcErrorFault",
    "StepSeconds",
    "UnhealthyAfterUpgrade",
    "WorkloadSpec",
    "generate_clusters",
    "load_fleet_file",
    "parse_fleet",
]

StepKind = Literal["serviceOut", "serviceIn", "controlPlane", "nodePool"]
STEP_KINDS: tuple[StepKind, ...] = ("serviceOut", "serviceIn", "controlPlane", "nodePool")
"""The step kinds of the fleet file, one per mutating RPC."""

GENERATED_REGIONS = ("us-east1", "us-west1", "europe-west1", "asia-east1")
GENERATED_NODE_POOLS = ("default-pool", "workers")


class ConfigError(ValueError):
    """The fleet file is unreadable or invalid; the message names the field and the fix."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class StepSeconds(_Model):
    """Seconds each step kind takes (PENDING → terminal); unset kinds fall back."""

    service_out: float | None = Field(default=None, ge=0)
    service_in: float | None = Field(default=None, ge=0)
    control_plane: float | None = Field(default=None, ge=0)
    node_pool: float | None = Field(default=None, ge=0)

    def get(self, kind: StepKind) -> float | None:
        """The seconds set for a step kind, or None."""
        value: float | None = getattr(self, _STEP_ATTR[kind])
        return value


_STEP_ATTR: dict[str, str] = {
    "serviceOut": "service_out",
    "serviceIn": "service_in",
    "controlPlane": "control_plane",
    "nodePool": "node_pool",
}

DEFAULT_STEP_SECONDS: dict[StepKind, float] = {
    "serviceOut": 1.0,
    "serviceIn": 1.0,
    "controlPlane": 5.0,
    "nodePool": 3.0,
}


class WorkloadSpec(_Model):
    """One workload on a cluster and the health the simulated collector reports for it."""

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    kind: str = "Deployment"
    healthy_replicas: int = Field(default=1, ge=0)
    # workload_health as the KubeFleet collector reports it: >= 1.0 healthy; "unknown" = no data.
    health: float | Literal["unknown"] = 1.0


class NodePoolSpec(_Model):
    """A node pool and its starting version."""

    name: str = Field(min_length=1)
    version: str


class MaintenanceWindowSpec(_Model):
    """A maintenance window or exclusion the cluster reports (Cluster.maintenance_windows).

    Information only, unless refuseUpgrades: then, while an exclusion is open (one-off
    windows only), upgrades are refused (FAILED_PRECONDITION, reason MAINTENANCE_EXCLUSION,
    retryable after its end) and PreflightUpgrade answers REFUSED_LATER.
    """

    kind: Literal["window", "exclusion"]
    name: str = ""
    start: datetime
    end: datetime
    recurrence: str = ""  # RFC 5545 RRULE, e.g. FREQ=WEEKLY;BYDAY=SA
    scope: str = ""  # exclusions: e.g. NO_MINOR_OR_NODE_UPGRADES
    refuse_upgrades: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> MaintenanceWindowSpec:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("start/end: write a time zone, e.g. 2026-11-23T02:00:00Z")
        if self.end <= self.start:
            raise ValueError("end: must be after start")
        if self.refuse_upgrades and (self.kind != "exclusion" or self.recurrence):
            raise ValueError("refuseUpgrades: only for a one-off exclusion (no recurrence)")
        return self


class ClusterSpec(_Model):
    """One cluster's starting state, step durations and health data."""

    id: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    control_plane_version: str
    node_pools: tuple[NodePoolSpec, ...] = ()
    available: bool = True
    in_service: bool = True
    step_seconds: StepSeconds = StepSeconds()
    workloads: tuple[WorkloadSpec, ...] | None = None  # None: defaults.workloads
    metrics: dict[str, float] | None = None  # None: defaults.metrics
    maintenance_windows: tuple[MaintenanceWindowSpec, ...] = ()

    @model_validator(mode="after")
    def _versions_consistent(self) -> ClusterSpec:
        _check_version("controlPlaneVersion", self.control_plane_version)
        seen: set[str] = set()
        for index, pool in enumerate(self.node_pools):
            _check_version(f"nodePools[{index}].version", pool.version)
            if pool.name in seen:
                raise ValueError(f"nodePools[{index}].name: {pool.name!r} appears twice")
            seen.add(pool.name)
            if is_newer_version(pool.version, self.control_plane_version):
                raise ValueError(
                    f"nodePools[{index}].version: {pool.version} is newer than "
                    f"controlPlaneVersion {self.control_plane_version}; a node pool cannot be "
                    "newer than its control plane"
                )
        return self


class Defaults(_Model):
    """Fleet-wide defaults: step durations, jitter, and health data of every cluster."""

    step_seconds: StepSeconds = StepSeconds()
    jitter: float = Field(default=0.1, ge=0, lt=1)
    workloads: tuple[WorkloadSpec, ...] = ()
    metrics: dict[str, float] = Field(default_factory=dict)


class GenerateSpec(_Model):
    """Generated clusters "cluster-00001".. with region and stage labels."""

    count: int = Field(ge=1, le=1_000_000)
    control_plane_version: str = "1.28.5"
    node_pool_version: str | None = None  # None: the control plane's version

    @model_validator(mode="after")
    def _versions_valid(self) -> GenerateSpec:
        _check_version("controlPlaneVersion", self.control_plane_version)
        if self.node_pool_version is not None:
            _check_version("nodePoolVersion", self.node_pool_version)
        return self


class _StepRule(_Model):
    """Which operations a step fault hits: a step kind on clusters (the first `times`)."""

    step: StepKind
    clusters: tuple[str, ...] = Field(min_length=1)
    node_pool: str = ""  # nodePool steps only: just this pool ("" = any)
    times: int | None = Field(default=None, ge=1)


class FailStep(_StepRule):
    """Makes a step on the given clusters end FAILED (the first `times` attempts, or always)."""

    error_code: str = ""  # default: UPGRADE_FAILED / SERVICE_OUT_FAILED / SERVICE_IN_FAILED
    message: str = ""


class HangStep(_StepRule):
    """The operation goes RUNNING and never ends (until POST /operations/{id}/finish)."""


class ForgetStep(_StepRule):
    """When the operation would end, the sim forgets it: GetOperation answers NOT_FOUND, no
    watch hears of it, the cluster is unchanged, and the request_id may start it afresh."""


class RefuseVersions(_Model):
    """Upgrades to these versions are refused (FAILED_PRECONDITION with this reason).

    With retryAfter the refusal is retryable (RetryInfo; PreflightUpgrade REFUSED_LATER),
    without it final (REFUSED_NEVER), like a version the provider does not offer.
    """

    versions: tuple[str, ...] = Field(min_length=1)
    clusters: tuple[str, ...] = ()  # empty: every cluster
    steps: tuple[Literal["controlPlane", "nodePool"], ...] = ("controlPlane", "nodePool")
    reason: str = "VERSION_NOT_OFFERED"
    retry_after: float | None = Field(default=None, ge=0)
    message: str = ""

    @model_validator(mode="after")
    def _versions_valid(self) -> RefuseVersions:
        for index, version in enumerate(self.versions):
            _check_version(f"versions[{index}]", version)
        return self


RpcCode = Literal[
    "UNAVAILABLE",
    "ABORTED",
    "FAILED_PRECONDITION",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "INTERNAL",
    "NOT_FOUND",
]


class RpcErrorFault(_Model):
    """Calls of one RPC answer this code (a share `rate` of them, at most `times`).

    reason / retryAfter fill the error details (retryAfter makes it retryable). after (for
    ServiceOut, ServiceIn, UpgradeControlPlane, UpgradeNodePool only): the request is
    carried out first and only its answer is lost, so the caller must repeat the request_id.
    """

    method: str = Field(min_length=1)
    code: RpcCode
    rate: float = Field(default=1.0, gt=0, le=1)
    times: int | None = Field(default=None, ge=1)
    reason: str = ""  # default: the code's usual reason
    retry_after: float | None = Field(default=None, ge=0)
    message: str = ""
    after: bool = False


class OutOfBandUpgrade(_Model):
    """Someone else upgrades the clusters `after` seconds from load (no operation)."""

    clusters: tuple[str, ...] = Field(min_length=1)
    after: float = Field(default=0.0, ge=0)
    control_plane_version: str
    node_pool_version: str | None = None  # every pool; None: pools unchanged

    @model_validator(mode="after")
    def _versions_valid(self) -> OutOfBandUpgrade:
        _check_version("controlPlaneVersion", self.control_plane_version)
        if self.node_pool_version is not None:
            _check_version("nodePoolVersion", self.node_pool_version)
        return self


class UnhealthyAfterUpgrade(_Model):
    """After a control-plane upgrade succeeds, workloads turn unhealthy and metrics change."""

    clusters: tuple[str, ...] = Field(min_length=1)
    metrics: dict[str, float] = Field(default_factory=dict)


class AvailabilityFlap(_Model):
    """The clusters alternate: available for `period` seconds, unavailable for `down`."""

    clusters: tuple[str, ...] = Field(min_length=1)
    period: float = Field(gt=0)
    down: float | None = Field(default=None, gt=0)  # None: same as period


class HangRpc(_Model):
    """Calls of one RPC wait this many seconds (or until the caller gives up) first."""

    method: str = Field(min_length=1)
    seconds: float = Field(gt=0)
    times: int | None = Field(default=None, ge=1)


_MUTATING_METHODS = frozenset({"ServiceOut", "ServiceIn", "UpgradeControlPlane", "UpgradeNodePool"})

# The RPCs faults may name: every ClusterService and HealthService method.
FAULTABLE_METHODS: frozenset[str] = frozenset(
    method.name
    for proto, service in (
        (cluster_pb2, "ClusterService"),
        (health_pb2, "HealthService"),
    )
    for method in proto.DESCRIPTOR.services_by_name[service].methods
)


def _check_method(field: str, name: str) -> None:
    short = name.rstrip("/").rsplit("/", 1)[-1]
    if short not in FAULTABLE_METHODS:
        raise ValueError(
            f"{field}: {name!r} is not a ClusterService or HealthService RPC; use one of "
            f"{', '.join(sorted(FAULTABLE_METHODS))}"
        )


class Faults(_Model):
    """Injected faults."""

    fail_step: tuple[FailStep, ...] = ()
    unhealthy_after_upgrade: tuple[UnhealthyAfterUpgrade, ...] = ()
    availability_flaps: tuple[AvailabilityFlap, ...] = ()
    unavailable_rate: float = Field(default=0.0, ge=0, le=1)
    unavailable_methods: tuple[str, ...] = ()  # empty: every Cluster/Health RPC
    hang_rpc: tuple[HangRpc, ...] = ()
    hang_step: tuple[HangStep, ...] = ()
    forget_step: tuple[ForgetStep, ...] = ()
    refuse_versions: tuple[RefuseVersions, ...] = ()
    rpc_errors: tuple[RpcErrorFault, ...] = ()
    out_of_band_upgrades: tuple[OutOfBandUpgrade, ...] = ()

    @model_validator(mode="after")
    def _methods_exist(self) -> Faults:
        for index, name in enumerate(self.unavailable_methods):
            _check_method(f"unavailableMethods[{index}]", name)
        for index, hang in enumerate(self.hang_rpc):
            _check_method(f"hangRpc[{index}].method", hang.method)
        for index, error in enumerate(self.rpc_errors):
            _check_method(f"rpcErrors[{index}].method", error.method)
            short = error.method.rstrip("/").rsplit("/", 1)[-1]
            if error.after and short not in _MUTATING_METHODS:
                raise ValueError(
                    f"rpcErrors[{index}].after: only for {', '.join(sorted(_MUTATING_METHODS))}"
                    "; other RPCs change nothing, so drop after"
                )
        return self


class FleetConfig(_Model):
    """The whole fleet file."""

    defaults: Defaults = Defaults()
    generate: GenerateSpec | None = None
    clusters: tuple[ClusterSpec, ...] = ()
    metrics: dict[str, float] = Field(default_factory=dict)  # answered without a cluster
    faults: Faults = Faults()

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        if self.generate is None and not self.clusters:
            raise ValueError("clusters: list at least one cluster, or set generate.count")
        ids: set[str] = set()
        if self.generate is not None:
            ids.update(_generated_id(i, self.generate.count) for i in range(self.generate.count))
        for index, cluster in enumerate(self.clusters):
            if cluster.id in ids:
                raise ValueError(
                    f"clusters[{index}].id: {cluster.id!r} is used twice; ids must be unique"
                )
            ids.add(cluster.id)
        faults = self.faults
        groups: list[tuple[str, tuple[Any, ...]]] = [
            ("failStep", faults.fail_step),
            ("hangStep", faults.hang_step),
            ("forgetStep", faults.forget_step),
            ("refuseVersions", faults.refuse_versions),
            ("unhealthyAfterUpgrade", faults.unhealthy_after_upgrade),
            ("availabilityFlaps", faults.availability_flaps),
            ("outOfBandUpgrades", faults.out_of_band_upgrades),
        ]
        for name, entries in groups:
            for index, entry in enumerate(entries):
                unknown = [c for c in entry.clusters if c not in ids]
                if unknown:
                    raise ValueError(
                        f"faults.{name}[{index}].clusters: unknown cluster id(s) "
                        f"{', '.join(unknown)}; use ids from clusters"
                    )
        return self

    def all_clusters(self) -> list[ClusterSpec]:
        """The generated clusters followed by the listed ones."""
        generated = generate_clusters(self.generate) if self.generate is not None else []
        return [*generated, *self.clusters]


def _check_version(field: str, value: str) -> None:
    try:
        parse_version(value)
    except ValueError:
        raise ValueError(
            f"{field}: {value!r} is not a version; write it like 1.29.4 or 1.29.4-gke.100"
        ) from None


def _generated_id(index: int, count: int) -> str:
    width = max(5, len(str(count)))
    return f"cluster-{index + 1:0{width}d}"


def _stage_of(index: int, count: int) -> str:
    # About 2% canary, 18% early, the rest main; at least one cluster per stage when count >= 3.
    canary = max(1, count * 2 // 100)
    early = max(1, count * 18 // 100)
    if index < canary:
        return "canary"
    if index < canary + early:
        return "early"
    return "main"


def generate_clusters(spec: GenerateSpec) -> list[ClusterSpec]:
    """spec.count clusters "cluster-00001".. labelled region (round robin) and stage.

    Stages: the first ~2% canary, the next ~18% early, the rest main. Two node pools
    (default-pool, workers) at nodePoolVersion (default: the control plane's version).
    """
    pool_version = spec.node_pool_version or spec.control_plane_version
    pools = tuple(
        NodePoolSpec.model_construct(name=name, version=pool_version)
        for name in GENERATED_NODE_POOLS
    )
    count = spec.count
    return [
        ClusterSpec.model_construct(
            id=_generated_id(i, count),
            labels={
                "region": GENERATED_REGIONS[i % len(GENERATED_REGIONS)],
                "stage": _stage_of(i, count),
            },
            control_plane_version=spec.control_plane_version,
            node_pools=pools,
            available=True,
            in_service=True,
            step_seconds=StepSeconds(),
            workloads=None,
            metrics=None,
            maintenance_windows=(),
        )
        for i in range(count)
    ]


def parse_fleet(data: Mapping[str, Any] | None, source: str = "fleet file") -> FleetConfig:
    """Validates parsed YAML; ConfigError lists each bad field as path: problem."""
    return validate_model(
        FleetConfig,
        data,
        source,
        ConfigError,
        not_mapping="expected a mapping with clusters/generate at the top",
    )


def load_fleet_file(path: str | Path) -> FleetConfig:
    """Reads and validates a fleet file; ConfigError names the file and the bad fields."""
    return parse_fleet(read_yaml(path, "--fleet", ConfigError), str(path))
