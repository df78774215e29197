"""The OCM plugin's configuration file: schema, defaults and validation with field-named errors."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from plugins.sdk import read_yaml, validate_model

__all__ = [
    "DEFAULT_TAINT_KEY",
    "DEFAULT_TAINT_VALUE",
    "OPENSHIFT_VERSION_SOURCE",
    "ClusterCuratorConfig",
    "ConfigError",
    "FeedbackMatch",
    "HubConfig",
    "JsonPathRule",
    "ManifestWorkConfig",
    "OcmConfig",
    "TaintConfig",
    "UpgradeFeedback",
    "WorkloadsConfig",
    "load_config",
    "parse_config",
    "parse_duration",
]

DEFAULT_TAINT_KEY = "fleetupgrade.io/service-out"
"""The key of the taint ServiceOut adds unless the configuration names another."""

OPENSHIFT_VERSION_SOURCE = "clusterClaim:version.openshift.io"
"""Where the OpenShift version is read: the ClusterClaim the registration agent reports on
OpenShift (status.version.kubernetes holds the Kubernetes version, e.g. v1.27.6+b49f9d1)."""

KUBERNETES_SOURCES = ("kubernetes", "clusterClaim:kubeversion.open-cluster-management.io")
"""Version sources that report the Kubernetes version, never an OpenShift one."""

DEFAULT_TAINT_VALUE = "fleet-upgrade-orchestrator"
"""The value that marks a taint as added by this plugin (its ownership mark)."""

# The taint key pattern of cluster.open-cluster-management.io/v1 Taint.key.
_TAINT_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
_KNOWN_PLACEHOLDERS = frozenset({"version", "cluster"})


class ConfigError(ValueError):
    """The configuration is unreadable or invalid; the message names the field and the fix."""


def parse_duration(value: int | float | str) -> timedelta:
    """A duration: a number of minutes (as ClusterCurator's monitorTimeout) or "1h30m", "90s".

    ValueError names the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError("must be minutes (a number) or a duration such as 120m, 2h or 90s")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("must be positive")
        return timedelta(minutes=value)
    text = value.strip()
    if not text or _DURATION_PART.sub("", text) != "":
        raise ValueError(
            f"{value!r} is not a duration; write minutes (120) or a duration such as 120m, 2h, 90s"
        )
    seconds = 0.0
    for number, unit in _DURATION_PART.findall(text):
        seconds += float(number) * {"h": 3600, "m": 60, "s": 1}[unit]
    if seconds <= 0:
        raise ValueError("must be positive")
    return timedelta(seconds=seconds)


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class TaintConfig(_Model):
    """The taint ServiceOut adds (effect NoSelect); key and value together mark it as ours."""

    key: str = DEFAULT_TAINT_KEY
    value: str = Field(default=DEFAULT_TAINT_VALUE, max_length=1024)
    wait_for_placements: bool = Field(
        default=True,
        description="ServiceOut succeeds once no PlacementDecision of a Placement that does not "
        "tolerate the taint still selects the cluster (the placement controller drops it "
        "asynchronously); false: as soon as the taint is on the hub",
    )

    @field_validator("key")
    @classmethod
    def _key_shape(cls, key: str) -> str:
        if len(key) > 316 or not _TAINT_KEY.match(key):
            raise ValueError(
                f"{key!r} is not a taint key; write a qualified name such as "
                "example.com/service-out (ManagedCluster spec.taints[].key rules)"
            )
        if key.startswith("cluster.open-cluster-management.io/"):
            raise ValueError(
                f"{key!r} is reserved for the OCM hub (unavailable/unreachable taints); "
                "choose a key in your own domain"
            )
        return key

    @field_validator("value")
    @classmethod
    def _value_set(cls, value: str) -> str:
        if not value:
            raise ValueError(
                "must not be empty: the value marks the taint as added by this plugin, so the "
                "plugin never removes a taint someone else added"
            )
        return value


class ClusterCuratorConfig(_Model):
    """Extra fields UpgradeControlPlane writes into the ClusterCurator's spec.upgrade, and
    where the ClusterCurator of a HyperShift hosted cluster goes.

    hosted_clusters: "Refuse" (the default) refuses to upgrade a cluster whose HostedCluster
    sits outside the cluster's namespace (the curator would run <cluster>/<cluster> as a
    standalone upgrade); "HostedClusterNamespace" writes its ClusterCurator, named after the
    cluster, into the HostedCluster's namespace, where the curator controller takes its hosted
    path (cluster-curator-controller controllers/clustercurator_controller.go isHostedCluster;
    docs/hosted-cluster-upgrade.md). Opt-in: the curator controller then binds its job's
    service account across namespaces there (rbac.ApplyRBACHypershift).
    """

    channel: str = ""
    upstream: str = ""
    hosted_clusters: Literal["Refuse", "HostedClusterNamespace"] = "Refuse"


class JsonPathRule(_Model):
    """One ManifestWork feedback rule: a named JSONPath into the delivered object."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _path_shape(cls, path: str) -> str:
        if not path.startswith("."):
            raise ValueError(
                f"{path!r} is not a feedback JSONPath; start it at the object, e.g. "
                '.status.conditions[?(@.type=="Complete")].status'
            )
        return path


class FeedbackMatch(_Model):
    """A feedback value that decides an outcome: the value named `name` equals `value`."""

    name: str = Field(min_length=1)
    value: str | int | bool


class UpgradeFeedback(_Model):
    """The status feedback of the delivered upgrade object that tells progress and the end."""

    json_paths: tuple[JsonPathRule, ...] = Field(min_length=1)
    succeeded: FeedbackMatch
    failed: FeedbackMatch | None = None
    message: str | None = None
    progress: str | None = None

    @model_validator(mode="after")
    def _names_exist(self) -> UpgradeFeedback:
        names = [rule.name for rule in self.json_paths]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"jsonPaths: names must be unique; {duplicates} repeat")
        known = ", ".join(names)
        refs = [
            ("succeeded.name", self.succeeded.name),
            ("failed.name", self.failed.name if self.failed else None),
            ("message", self.message),
            ("progress", self.progress),
        ]
        for field, ref in refs:
            if ref is not None and ref not in names:
                raise ValueError(f"{field}: {ref!r} is not one of the jsonPaths names ({known})")
        return self


class ManifestWorkConfig(_Model):
    """upgradeMethod ManifestWork: the manifest template delivered and how its feedback reads."""

    name: str = "fleetupgrade-upgrade"
    template: dict[str, Any]
    resource: str = Field(min_length=1)
    feedback: UpgradeFeedback

    @field_validator("name")
    @classmethod
    def _name_shape(cls, name: str) -> str:
        if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{name!r} is not a valid object name; use lowercase DNS letters")
        return name

    @field_validator("template", mode="before")
    @classmethod
    def _template_text(cls, template: Any) -> Any:
        if isinstance(template, str):
            try:
                template = yaml.safe_load(template)
            except yaml.YAMLError as exc:
                raise ValueError(f"not valid YAML ({exc})") from None
        return template

    @field_validator("template")
    @classmethod
    def _template_shape(cls, template: dict[str, Any]) -> dict[str, Any]:
        missing = [
            f
            for f, ok in (
                ("apiVersion", isinstance(template.get("apiVersion"), str)),
                ("kind", isinstance(template.get("kind"), str)),
                (
                    "metadata.name",
                    isinstance(template.get("metadata"), dict)
                    and isinstance(template["metadata"].get("name"), str),
                ),
            )
            if not ok
        ]
        if missing:
            raise ValueError(
                f"the manifest needs {', '.join(missing)}; give a full object such as a "
                "system-upgrade-controller Plan"
            )
        unknown = sorted(set(_placeholders(template)) - _KNOWN_PLACEHOLDERS)
        if unknown:
            raise ValueError(
                f"unknown placeholders {unknown}; only {{{{version}}}} and {{{{cluster}}}} exist"
            )
        return template

    @field_validator("resource")
    @classmethod
    def _resource_shape(cls, resource: str) -> str:
        if not _DNS_LABEL.match(resource):
            raise ValueError(f"{resource!r} is not a resource name; give the plural, e.g. plans")
        return resource


class WorkloadsConfig(_Model):
    """HealthService.CheckWorkloads: the read-only ManifestWork that reports Deployments."""

    manifest_work_name: str = "fleetupgrade-health"
    feedback: Literal["WellKnownStatus", "JSONPaths"] = "WellKnownStatus"
    max_workloads: int = Field(default=50, ge=1, le=500)

    @field_validator("manifest_work_name")
    @classmethod
    def _name_shape(cls, name: str) -> str:
        if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{name!r} is not a valid object name; use lowercase DNS letters")
        return name


class HubConfig(_Model):
    """One OCM hub the plugin fronts: a name (the HUB of HUB/CLUSTER ids) and its kubeconfig."""

    name: str
    kubeconfig: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, name: str) -> str:
        if len(name) > 63 or not _DNS_LABEL.match(name):
            raise ValueError(
                f"{name!r} is not a hub name; use a DNS label (lowercase letters, digits, '-'), "
                "e.g. tenant-a: cluster ids become <name>/<cluster>"
            )
        return name


class OcmConfig(_Model):
    """The whole configuration file of fleet-plugin-ocm."""

    upgrade_method: Literal["ClusterCurator", "ManifestWork"]
    monitor_timeout: timedelta = timedelta(minutes=120)
    taint: TaintConfig = TaintConfig()
    cluster_curator: ClusterCuratorConfig = ClusterCuratorConfig()
    manifest_work: ManifestWorkConfig | None = None
    workloads: WorkloadsConfig = WorkloadsConfig()
    cluster_claim_label_prefix: str = "clusterclaim/"
    version_source: str = ""
    hubs: tuple[HubConfig, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _default_version_source(cls, data: Any) -> Any:
        """versionSource by upgradeMethod when not given: ClusterCurator upgrades to an
        OpenShift version, so the OpenShift version claim; ManifestWork, Kubernetes'."""
        if isinstance(data, dict) and not data.get("versionSource", data.get("version_source")):
            method = data.get("upgradeMethod", data.get("upgrade_method"))
            data = {
                **data,
                "versionSource": OPENSHIFT_VERSION_SOURCE
                if method == "ClusterCurator"
                else "kubernetes",
            }
            data.pop("version_source", None)
        return data

    @field_validator("hubs")
    @classmethod
    def _hub_names_unique(cls, hubs: tuple[HubConfig, ...]) -> tuple[HubConfig, ...]:
        names = [hub.name for hub in hubs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"hub names must be unique; {repeated} repeat")
        return hubs

    @field_validator("monitor_timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> timedelta:
        if isinstance(value, timedelta):
            return value
        if not isinstance(value, int | float | str):
            raise ValueError("must be minutes (a number) or a duration such as 120m, 2h or 90s")
        return parse_duration(value)

    @field_validator("version_source")
    @classmethod
    def _version_source(cls, value: str) -> str:
        kind, _, name = value.partition(":")
        if value == "kubernetes" or (kind in ("clusterClaim", "label") and name):
            return value
        raise ValueError(
            f"{value!r} is not a version source; use kubernetes (status.version.kubernetes), "
            "clusterClaim:<name> (e.g. clusterClaim:version.openshift.io) or label:<key>"
        )

    @model_validator(mode="after")
    def _method_needs(self) -> OcmConfig:
        if self.upgrade_method == "ClusterCurator" and self.version_source in KUBERNETES_SOURCES:
            raise ValueError(
                f"versionSource: {self.version_source} reports the Kubernetes version (e.g. "
                "v1.27.6+b49f9d1 on OpenShift) but upgradeMethod ClusterCurator upgrades to an "
                "OpenShift version (desiredUpdate, e.g. 4.14.10): they never match, so every "
                f"upgrade would end FAILED TIMEOUT; use versionSource: {OPENSHIFT_VERSION_SOURCE} "
                "(the default for ClusterCurator)"
            )
        if self.upgrade_method == "ManifestWork" and self.manifest_work is None:
            raise ValueError(
                "manifestWork: required when upgradeMethod is ManifestWork; give the template, "
                "its resource and the feedback rules"
            )
        return self

    @property
    def monitor_timeout_minutes(self) -> int:
        """monitorTimeout as ClusterCurator's integer minutes (rounded up, at least 1)."""
        seconds = self.monitor_timeout.total_seconds()
        return max(1, int(-(-seconds // 60)))


def _placeholders(value: Any) -> list[str]:
    if isinstance(value, str):
        return _PLACEHOLDER.findall(value)
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in (*_placeholders(k), *_placeholders(v))]
    if isinstance(value, list):
        return [p for item in value for p in _placeholders(item)]
    return []


def _explain(error: ErrorDetails, message: str) -> str:
    if error["type"] == "literal_error":
        expected = (error.get("ctx") or {}).get("expected", "")
        return f"{error.get('input')!r} is not allowed; use {expected}"
    if error["type"] == "missing":
        return "missing; this field is required"
    return message


def parse_config(data: Mapping[str, Any] | None, source: str = "config") -> OcmConfig:
    """Validates parsed YAML; ConfigError lists each bad field as path: problem."""
    return validate_model(
        OcmConfig,
        data,
        source,
        ConfigError,
        not_mapping="expected a mapping with upgradeMethod (ClusterCurator or ManifestWork)",
        explain=_explain,
    )


def load_config(path: str | Path) -> OcmConfig:
    """Reads and validates a configuration file; ConfigError names the file and the bad fields."""
    return parse_config(read_yaml(path, "--config", ConfigError), str(path))
