"""The AKS plugin's configuration file (YAML): which managed clusters, how to reach ARM, how
operations are kept, and what ServiceOut does."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from plugins.aks.ids import ClusterRef, parse_cluster_id
from plugins.sdk import read_yaml, validate_model

__all__ = [
    "ARM_ENDPOINT",
    "AksConfig",
    "ApiConfig",
    "ClusterSelection",
    "ConfigError",
    "Discovery",
    "OperationsConfig",
    "TrafficConfig",
    "UpgradesConfig",
    "aks_fleet_id",
    "load_config",
    "parse_config",
]

ARM_ENDPOINT = "https://management.azure.com"
"""Azure Resource Manager in the public cloud (the SDK's default base_url)."""


class ConfigError(ValueError):
    """The configuration is unreadable or invalid; the message names the file and the fields."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def _segment(value: str, what: str) -> str:
    if not value or "/" in value or value != value.strip():
        raise ValueError(f"must be {what} (no slashes or spaces)")
    return value


class Discovery(_Model):
    """Every managed cluster of a subscription (and resource group, when given) whose tags
    include matchTags."""

    subscription: str
    resource_group: str = Field(default="", description="empty: every resource group")
    match_tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("subscription")
    @classmethod
    def _subscription(cls, value: str) -> str:
        return _segment(value, "a subscription id such as 00000000-0000-0000-0000-000000000000")

    @field_validator("resource_group")
    @classmethod
    def _group(cls, value: str) -> str:
        return value and _segment(value, "a resource group name")


class ClusterSelection(_Model):
    """The clusters the plugin manages: explicit resource ids and/or discovery rules (union)."""

    ids: list[str] = Field(default_factory=list)
    discover: list[Discovery] = Field(default_factory=list)

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        refs: list[ClusterRef] = []
        for index, cluster_id in enumerate(value):
            ref = parse_cluster_id(cluster_id)
            if ref is None:
                raise ValueError(
                    f"[{index}] {cluster_id!r} is not an AKS cluster resource id; write it as "
                    "/subscriptions/SUB/resourceGroups/RG/providers/"
                    "Microsoft.ContainerService/managedClusters/NAME"
                )
            refs.append(ref)
        if len({r.id for r in refs}) != len(refs):
            raise ValueError("lists a cluster twice (ids are case-insensitive); remove one")
        return [r.id for r in refs]

    @model_validator(mode="after")
    def _some(self) -> ClusterSelection:
        if not self.ids and not self.discover:
            raise ValueError(
                "clusters: needs ids or discover (or both); list cluster resource ids or a "
                "subscription to discover"
            )
        return self


class ApiConfig(_Model):
    """Where Azure Resource Manager is and how the plugin authenticates to it.

    credentials: workloadIdentity (azure-identity's WorkloadIdentityCredential, from the
    AZURE_CLIENT_ID / AZURE_TENANT_ID / AZURE_FEDERATED_TOKEN_FILE the AKS workload identity
    webhook injects) or default (DefaultAzureCredential: environment, workload identity,
    managed identity, ...). No secret is ever read from this file.
    """

    endpoint: str = ARM_ENDPOINT
    credentials: Literal["workloadIdentity", "default"] = "workloadIdentity"
    ca_file: str = Field(default="", description="PEM bundle to trust instead of the system's")
    disable_instance_discovery: bool = Field(
        default=False,
        description="trust AZURE_AUTHORITY_HOST without asking login.microsoftonline.com "
        "(Azure Stack Hub, air-gapped clouds, an emulator)",
    )
    timeout_seconds: float = Field(default=8.0, gt=0, le=60)
    retries: int = Field(
        default=0,
        ge=0,
        le=10,
        description="azure-core's own retries of a 429 / 5xx; each may sleep ARM's "
        "Retry-After, past the caller's deadline, so 0: the caller retries UNAVAILABLE itself",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.netloc or parts.path not in ("", "/"):
            raise ValueError(
                "must be an https:// URL of Azure Resource Manager such as "
                f"{ARM_ENDPOINT} (azure-core sends tokens only over https)"
            )
        return value.rstrip("/")


class OperationsConfig(_Model):
    """How the plugin follows ARM's long-running operations and where it keeps them."""

    poll_seconds: float = Field(default=10.0, gt=0, le=300)
    state_file: str = Field(
        default="",
        description="journal of operations (JSON lines); makes operations durable",
    )


class UpgradesConfig(_Model):
    """Upgrade policy.

    nodeImageWhenCurrent: an UpgradeNodePool to the version a pool already runs upgrades its
    node image (agentPools/upgradeNodeImageVersion) instead of answering "nothing to do".
    """

    node_image_when_current: bool = False


class TrafficConfig(_Model):
    """What ServiceOut / ServiceIn do.

    unsupported (the default): no traffic capability is declared; compose the plugin with one
    that drains traffic (KubeFleet taints). recordOnly: ServiceOut and ServiceIn succeed at
    once and only record the cluster's state (for fleets whose clusters share no traffic); no
    traffic moves.
    """

    mode: Literal["unsupported", "recordOnly"] = "unsupported"


class AksConfig(_Model):
    """The whole configuration file."""

    clusters: ClusterSelection
    api: ApiConfig = Field(default_factory=ApiConfig)
    operations: OperationsConfig = Field(default_factory=OperationsConfig)
    upgrades: UpgradesConfig = Field(default_factory=UpgradesConfig)
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)


def _explain(error: ErrorDetails, message: str) -> str:
    return "is required" if error["type"] == "missing" else message


def _place(where: str, message: str) -> str:
    if message.startswith("clusters:"):
        return message
    if message.startswith("["):
        return f"{where}{message}"
    return f"{where}: {message}" if where else message


def parse_config(data: Any, source: str = "config") -> AksConfig:
    """Validates configuration data; ConfigError lists every bad field with its fix."""
    return validate_model(
        AksConfig,
        data,
        source,
        ConfigError,
        not_mapping="must be a mapping with at least `clusters:`",
        explain=_explain,
        place=_place,
    )


def load_config(path: str | Path) -> AksConfig:
    """Reads and validates the YAML file at path."""
    return parse_config(read_yaml(path, "--config", ConfigError), str(path))


def aks_fleet_id(config: AksConfig) -> str:
    """What this plugin acts on (GetPluginInfo fleet_id), stable across restarts and replicas.

    aks:SUBSCRIPTION:RESOURCE_GROUP when the configuration selects clusters of one resource
    group (`*` for a whole subscription), on the public ARM endpoint; otherwise aks: and a
    short digest of the endpoint and the selection. Cluster ids are ARM resource ids, unique
    in Azure, so two plugins naming one resource group are one provider.
    """
    scopes = {
        (ref.subscription, ref.group)
        for ref in map(parse_cluster_id, config.clusters.ids)
        if ref is not None
    }
    rules = sorted(
        f"{d.subscription.lower()}/{d.resource_group.lower() or '*'}?{sorted(d.match_tags.items())}"
        for d in config.clusters.discover
    )
    scopes |= {
        (d.subscription.lower(), d.resource_group.lower() or "*") for d in config.clusters.discover
    }
    if len(scopes) == 1 and config.api.endpoint == ARM_ENDPOINT:
        subscription, group = next(iter(scopes))
        return f"aks:{subscription}:{group}"
    text = json.dumps([config.api.endpoint, sorted(config.clusters.ids), rules])
    return "aks:" + hashlib.sha256(text.encode()).hexdigest()[:16]
