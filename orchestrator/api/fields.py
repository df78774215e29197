"""The field types every kind shares: group and version, patterns, durations, label rules and
selectors, Secret references, TLS, plugin endpoints, conditions, the model base."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

__all__ = [
    "API_VERSION",
    "DURATION_PATTERN",
    "ENDPOINT_PATTERN",
    "FINALIZER",
    "GROUP",
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "NAME_PATTERN",
    "POSITIVE_DURATION_PATTERN",
    "TIME_OF_DAY_PATTERN",
    "VERSION",
    "VERSION_PATTERN",
    "AllowedNamespaces",
    "CheckInterval",
    "Condition",
    "IntOrPercent",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LabelValue",
    "OpsEndpoint",
    "ProviderRef",
    "SecretKeyRef",
    "SoakTime",
    "SourceRef",
    "StepTimeout",
    "TLSConfig",
    "Timeout",
    "Version",
    "WindowDuration",
    "label_key_problem",
    "label_value_problem",
    "parse_duration",
    "parse_max_concurrency",
    "parse_max_failures",
]


GROUP = "multicluster-ops.io"


VERSION = "v1"


API_VERSION = f"{GROUP}/{VERSION}"


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


@functools.lru_cache(maxsize=1024)
def parse_duration(text: str) -> timedelta:
    """Parse a Go-style duration such as "90s", "10m" or "1h30m" (cached: a pass asks for the
    same few timeouts once per cluster in flight)."""
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


#: One `__pydantic_fields_set__` per distinct set of field names, shared by every model that set
#: those fields (see _Model.model_post_init).
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    def model_post_init(self, context: Any, /) -> None:
        """Share the set of fields given (pydantic's `__pydantic_fields_set__`) with the models
        that were given the same fields. Each is a set of its own otherwise, 216 to 728 bytes:
        at 10,000 clusters the parsed ClusterUpgrades and specs held 20-30 MiB of them (issue
        21). Safe as the models are frozen: pydantic adds to the set only on assignment, which
        frozen refuses, and model_copy copies it before adding to it."""
        given = self.__pydantic_fields_set__
        shared = _FIELDS_SETS.setdefault(frozenset(given), given)
        if shared is not given:
            object.__setattr__(self, "__pydantic_fields_set__", shared)

    def dump(self, only: set[str] | None = None) -> dict[str, Any]:
        """The object as Kubernetes JSON (camelCase, unset optional fields left out); only:
        these fields alone (by Python name)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json", include=only)


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


class Condition(_Model):
    """A metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str


#: The finalizer on every ClusterVersion, UpdateRun and ClusterUpgrade: deleting one is an
#: operation that brings back into service what its run took out before the object goes
#: (orchestrator.pipeline.deletion; docs/operations.md "What deleting a rollout does").
FINALIZER = f"{GROUP}/back-in-service"


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
