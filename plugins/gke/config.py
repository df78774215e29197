"""The GKE plugin's configuration file (YAML): which clusters, how to drain traffic, API access."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from plugins.sdk import read_yaml, validate_model

__all__ = [
    "ApiConfig",
    "BackendServiceRef",
    "ClusterSelection",
    "ConfigError",
    "Discovery",
    "GkeConfig",
    "OperationsConfig",
    "TrafficConfig",
    "UpgradesConfig",
    "gke_fleet_id",
    "load_config",
    "parse_config",
]

_CLUSTER_ID = re.compile(r"^projects/([^/]+)/locations/([^/]+)/clusters/([^/]+)$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class ConfigError(ValueError):
    """The configuration is unreadable or invalid; the message names the file and the fields."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Discovery(_Model):
    """Every cluster of a project and location whose resource labels include matchLabels."""

    project: str
    location: str = Field(description='a region, a zone, or "-" for every location')
    match_labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not value or "/" in value:
            raise ValueError("must be a project id such as my-project")
        return value

    @field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        if not value or "/" in value:
            raise ValueError('must be a region (us-central1), a zone (us-central1-a) or "-"')
        return value


class ClusterSelection(_Model):
    """The clusters the plugin manages: explicit ids and/or discovery rules (union)."""

    ids: list[str] = Field(default_factory=list)
    discover: list[Discovery] = Field(default_factory=list)

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        for index, cluster_id in enumerate(value):
            if not _CLUSTER_ID.match(cluster_id):
                raise ValueError(
                    f"[{index}] {cluster_id!r} is not a GKE cluster id; write it as "
                    "projects/PROJECT/locations/LOCATION/clusters/NAME"
                )
        if len(set(value)) != len(value):
            raise ValueError("lists a cluster twice; remove the duplicate")
        return value

    @model_validator(mode="after")
    def _some(self) -> ClusterSelection:
        if not self.ids and not self.discover:
            raise ValueError(
                "clusters: needs ids or discover (or both); list cluster ids or a project and "
                "location to discover"
            )
        return self


class BackendServiceRef(_Model):
    """A global backend service (compute v1) that sends traffic to the fleet's clusters."""

    project: str
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be a backend service name (lowercase letters, digits, -)")
        return value


class TrafficConfig(_Model):
    """How ServiceOut drains a cluster: not at all (none) or via backend capacity scalers."""

    mode: Literal["none", "backendServices"] = "none"
    backend_services: list[BackendServiceRef] = Field(default_factory=list)
    backends: dict[str, list[str]] = Field(
        default_factory=dict,
        description="cluster id -> the instance group / NEG URLs that serve it",
    )
    allow_zero_capacity: bool = Field(
        default=False,
        description="let a drain leave a backend service with no serving backend (a regional "
        "cluster's zonal NEGs can be every backend of a service); off by default",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrafficConfig:
        if self.mode == "backendServices":
            if not self.backend_services:
                raise ValueError(
                    "traffic.backendServices: must list at least one {project, name} with "
                    "mode backendServices"
                )
            if not self.backends:
                raise ValueError(
                    "traffic.backends: must map each cluster id to its backend groups "
                    "(instance group or NEG URLs) with mode backendServices"
                )
        for cluster_id, groups in self.backends.items():
            if not _CLUSTER_ID.match(cluster_id):
                raise ValueError(
                    f"traffic.backends: key {cluster_id!r} is not a GKE cluster id; write "
                    "projects/PROJECT/locations/LOCATION/clusters/NAME"
                )
            if not groups:
                raise ValueError(
                    f"traffic.backends[{cluster_id}]: must list at least one group URL"
                )
            for group in groups:
                if "/projects/" not in f"/{group}":
                    raise ValueError(
                        f"traffic.backends[{cluster_id}]: {group!r} is not a group URL; write "
                        "projects/P/zones/Z/networkEndpointGroups/NAME or a full compute URL"
                    )
        return self


class ApiConfig(_Model):
    """Where the Google APIs are and how to authenticate to them."""

    container_endpoint: str = ""
    compute_endpoint: str = ""
    credentials: Literal["default", "anonymous"] = "default"
    timeout_seconds: float = Field(default=8.0, gt=0, le=60)

    @model_validator(mode="after")
    def _anonymous_needs_override(self) -> ApiConfig:
        if self.credentials == "anonymous" and not self.container_endpoint:
            raise ValueError(
                "api.credentials: anonymous is only allowed with api.containerEndpoint set "
                "(an emulator); remove it to use Application Default Credentials"
            )
        return self


class OperationsConfig(_Model):
    """How the plugin follows GKE operations and where it keeps request bindings."""

    poll_seconds: float = Field(default=5.0, gt=0, le=300)
    state_file: str = ""
    adopt_done_within_seconds: float = Field(default=3600.0, ge=0)


class UpgradesConfig(_Model):
    """Upgrade policy the plugin applies before calling GKE.

    GKE's maintenance exclusions forbid only GKE's *automatic* maintenance; manual upgrades go
    through them. The plugin reports windows and exclusions on each cluster (information for
    the orchestrator) and, by default, lets upgrades through as GKE does. Set
    respectMaintenanceExclusions to refuse (retryable) upgrades inside an active exclusion
    whose scope covers them.
    """

    respect_maintenance_exclusions: bool = False


class GkeConfig(_Model):
    """The whole configuration file."""

    clusters: ClusterSelection
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    operations: OperationsConfig = Field(default_factory=OperationsConfig)
    upgrades: UpgradesConfig = Field(default_factory=UpgradesConfig)


def _explain(error: ErrorDetails, message: str) -> str:
    return "is required" if error["type"] == "missing" else message


def _place(where: str, message: str) -> str:
    if message.startswith(("traffic.", "api.", "clusters:")):
        return message  # cross-field checks name their own fields
    if message.startswith("["):
        return f"{where}{message}"
    return f"{where}: {message}" if where else message


def parse_config(data: Any, source: str = "config") -> GkeConfig:
    """Validates configuration data; ConfigError lists every bad field with its fix."""
    return validate_model(
        GkeConfig,
        data,
        source,
        ConfigError,
        not_mapping="must be a mapping with at least `clusters:`",
        explain=_explain,
        place=_place,
    )


def load_config(path: str | Path) -> GkeConfig:
    """Reads and validates the YAML file at path."""
    return parse_config(read_yaml(path, "--config", ConfigError), str(path))


def gke_fleet_id(config: GkeConfig) -> str:
    """What this plugin acts on (GetPluginInfo fleet_id): the clusters its configuration
    selects on one GKE endpoint, as a short digest. Two plugin addresses, or two replicas, with
    the same selection are one provider; a different selection is another."""
    endpoint = config.api.container_endpoint or "container.googleapis.com"
    rules = sorted(
        f"{d.project}/{d.location}?{sorted(d.match_labels.items())}"
        for d in config.clusters.discover
    )
    text = json.dumps([endpoint, sorted(config.clusters.ids), rules])
    return "gke:" + hashlib.sha256(text.encode()).hexdigest()[:16]
