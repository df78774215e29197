"""The EKS plugin's configuration file (YAML): which account, regions and clusters, how to
follow updates, API access. Credentials are never configured here: boto3's default chain finds
them (environment, IRSA web identity, EKS Pod Identity, instance profile)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from plugins.sdk import place_problem, read_yaml, validate_model

__all__ = [
    "ApiConfig",
    "ClusterSelection",
    "ConfigError",
    "EksConfig",
    "OperationsConfig",
    "PreflightConfig",
    "Route53Config",
    "TrafficConfig",
    "WeightedRecord",
    "eks_fleet_id",
    "load_config",
    "parse_config",
]

_ACCOUNT = re.compile(r"^\d{12}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_CLUSTER_ARN = re.compile(r"^arn:aws[a-z-]*:eks:[a-z0-9-]+:\d{12}:cluster/[0-9A-Za-z][\w-]*$")
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")  # CreateCluster name rules


class ConfigError(ValueError):
    """The configuration is unreadable or invalid; the message names the file and the fields."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ClusterSelection(_Model):
    """Which clusters of the account's regions the plugin manages: every cluster whose tags
    include matchTags, narrowed to names when names is not empty."""

    names: list[str] = Field(default_factory=list)
    match_tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("names")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for index, name in enumerate(value):
            if not _CLUSTER_NAME.match(name):
                raise ValueError(
                    f"[{index}] {name!r} is not an EKS cluster name; write the name as "
                    "`aws eks list-clusters` shows it (letters, digits, - and _)"
                )
        return value


class WeightedRecord(_Model):
    """One Route 53 weighted record set that sends traffic to the cluster: ServiceOut sets its
    Weight to 0, ServiceIn back to weight."""

    hosted_zone_id: str
    name: str
    type: Literal["A", "AAAA", "CNAME"] = "A"
    set_identifier: str
    weight: int = Field(ge=1, le=255, description="the record's weight while in service")

    @field_validator("hosted_zone_id")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone = value.removeprefix("/hostedzone/")
        if not re.fullmatch(r"[A-Z0-9]{1,32}", zone):
            raise ValueError("must be a Route 53 hosted zone id such as Z0123456789ABCDEFGHIJ")
        return zone

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or " " in value:
            raise ValueError("must be the record's DNS name, such as app.example.com")
        return value if value.endswith(".") else value + "."


class Route53Config(_Model):
    """Route 53 weighted records per cluster (by cluster ARN)."""

    records: dict[str, list[WeightedRecord]] = Field(min_length=1)
    drain_seconds: float | None = Field(
        default=None, ge=0, description="wait after INSYNC; default: the records' TTL"
    )
    endpoint: str = Field(default="", description="only for an emulator")

    @field_validator("records")
    @classmethod
    def _records(cls, value: dict[str, list[WeightedRecord]]) -> dict[str, list[WeightedRecord]]:
        for cluster_id, records in value.items():
            if not _CLUSTER_ARN.match(cluster_id):
                raise ValueError(
                    f"{cluster_id!r}: key must be a cluster ARN "
                    "(arn:aws:eks:REGION:ACCOUNT:cluster/NAME)"
                )
            if not records:
                raise ValueError(f"{cluster_id}: list at least one weighted record")
        return value


class TrafficConfig(_Model):
    """How ServiceOut drains a cluster. route53: weight 0 on the cluster's weighted records
    (ServiceIn restores the configured weight). none: the plugin records the cluster as out of
    service and drains nothing (drain outside, or compose a traffic plugin)."""

    mode: Literal["none", "route53"] = "none"
    route53: Route53Config | None = None

    @model_validator(mode="after")
    def _route53_needs_records(self) -> TrafficConfig:
        if self.mode == "route53" and self.route53 is None:
            raise ValueError(
                "traffic.route53: is required with mode route53; list each cluster's "
                "weighted records (docs/plugins/eks.md, Traffic)"
            )
        return self


class ApiConfig(_Model):
    """Where the EKS API is. endpoint: only for an emulator or a VPC interface endpoint."""

    endpoint: str = ""
    timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="botocore standard retry mode: attempts per call, the first included",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value and not value.startswith(("https://", "http://127.0.0.1", "http://localhost")):
            raise ValueError(
                "must be an https:// URL (plain http only on loopback, for an emulator); "
                "leave it empty for EKS's regional endpoints"
            )
        return value


class OperationsConfig(_Model):
    """How the plugin follows EKS updates and where it journals its operations."""

    poll_seconds: float = Field(default=10.0, gt=0, le=300)
    state_file: str = ""


class PreflightConfig(_Model):
    """When to ask again after an EKS upgrade insight refused a target (insights refresh about
    once a day, and at once on `aws eks describe-insight --refresh`)."""

    insight_retry_seconds: float = Field(default=3600.0, ge=0)


class EksConfig(_Model):
    """The whole configuration file."""

    account: str
    regions: list[str] = Field(min_length=1)
    clusters: ClusterSelection = Field(default_factory=ClusterSelection)
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    operations: OperationsConfig = Field(default_factory=OperationsConfig)
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)

    @field_validator("account")
    @classmethod
    def _account(cls, value: str) -> str:
        if not _ACCOUNT.match(value):
            raise ValueError(
                "must be the 12-digit AWS account id of the clusters (quote it in YAML: "
                '"123456789012")'
            )
        return value

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: list[str]) -> list[str]:
        for index, region in enumerate(value):
            if not _REGION.match(region):
                raise ValueError(f"[{index}] {region!r} is not an AWS region such as us-east-1")
        if len(set(value)) != len(value):
            raise ValueError("lists a region twice; name each region once")
        return value


def eks_fleet_id(config: EksConfig) -> str:
    """What this plugin acts on (GetPluginInfo fleet_id): eks:<account>:<regions>, plus the
    endpoint when one is configured. Two plugins on the same account and regions are one
    provider whatever their cluster selection: an EKS cluster is the same cluster to both, so
    their runs must see each other's holdings and floors."""
    text = f"eks:{config.account}:{','.join(sorted(config.regions))}"
    if config.api.endpoint:
        text += f"@{config.api.endpoint}"
    return text[:256]


def parse_config(data: Any, source: str = "config") -> EksConfig:
    """Validates configuration data; ConfigError lists every bad field with its fix."""
    return validate_model(
        EksConfig,
        data,
        source,
        ConfigError,
        not_mapping="must be a mapping with at least `account:` and `regions:`",
        place=_place,
    )


def _place(where: str, message: str) -> str:
    if message.startswith("traffic."):
        return message  # cross-field checks name their own fields
    if message.startswith("["):
        return f"{where}{message}"  # regions[2] ..., clusters.names[0] ...
    return place_problem(where, message)


def load_config(path: str | Path) -> EksConfig:
    """Reads and validates the YAML file at path."""
    return parse_config(read_yaml(path, "--config", ConfigError), str(path))
