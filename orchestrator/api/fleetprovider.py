"""The FleetProvider kind: a provider plugin a platform admin declares, and who may use it;
or a provider composed of one declared plugin per capability (docs/plugin-contract.md,
"Composed providers")."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from orchestrator.api.fields import ENDPOINT_PATTERN, AllowedNamespaces, TLSConfig, _Model

__all__ = [
    "CLUSTER_ID_PLACEHOLDER",
    "CLUSTER_ID_TEMPLATE_PATTERN",
    "FLEET_PROVIDER_KIND",
    "FLEET_PROVIDER_PLURAL",
    "PART_ROLES",
    "FleetProviderSpec",
    "ProviderPart",
    "ProviderParts",
]


FLEET_PROVIDER_KIND = "FleetProvider"


FLEET_PROVIDER_PLURAL = "fleetproviders"

#: The template of a part whose cluster ids are the inventory plugin's (the default).
CLUSTER_ID_PLACEHOLDER = "{id}"
#: A part's clusterId template: text with `{id}` (the inventory plugin's cluster id) and
#: `{label:KEY}` (that cluster's label KEY) placeholders, each optionally `|lower`. Kept to what
#: both Python's re and the apiserver's (Go RE2) accept.
CLUSTER_ID_TEMPLATE_PATTERN = r"^([^{}]|\{(id|label:[A-Za-z0-9./_-]+)(\|lower)?\})+$"
_PLACEHOLDER = re.compile(r"\{(id|label:[A-Za-z0-9./_-]+)(\|lower)?\}")

#: The capabilities a composed provider routes, in the order they are listed and checked.
PART_ROLES = ("inventory", "traffic", "upgrades", "preflight", "health")


class ProviderPart(_Model):
    """One capability of a composed provider: a FleetProvider (declared with its endpoint and
    TLS) and how the inventory plugin's cluster ids become that plugin's."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="A FleetProvider with an endpoint (not itself composed). Its "
        "allowedNamespaces do not matter here: this FleetProvider's do.",
    )
    cluster_id: str | None = Field(
        default=None,
        max_length=512,
        pattern=CLUSTER_ID_TEMPLATE_PATTERN,
        description="The part's id of a cluster, from the inventory plugin's: {id} (its id) "
        "and {label:KEY} (its label KEY), each optionally {...|lower}, e.g. "
        "/subscriptions/{label:fleet.azure.com/subscription-id}/resourceGroups/"
        "{label:fleet.azure.com/resource-group|lower}/providers/Microsoft.ContainerService/"
        "managedClusters/{label:fleet.azure.com/cluster-name|lower}. Default {id}.",
    )

    @property
    def template(self) -> str:
        """The clusterId template, the default filled in."""
        return self.cluster_id or CLUSTER_ID_PLACEHOLDER

    def labels_used(self) -> list[str]:
        """The label keys the template reads."""
        return [
            m.group(1)[len("label:") :]
            for m in _PLACEHOLDER.finditer(self.template)
            if m.group(1).startswith("label:")
        ]


class ProviderParts(_Model):
    """One FleetProvider per capability; inventory, traffic and upgrades are required."""

    inventory: ProviderPart = Field(
        description="ListClusters: the run's cluster ids, labels (stage selectors), "
        "availability. Its ids are the run's; it takes no clusterId."
    )
    traffic: ProviderPart = Field(description="ServiceOut / ServiceIn (CLUSTER_SERVICE).")
    upgrades: ProviderPart = Field(
        description="UpgradeControlPlane / UpgradeNodePool, and the source of truth for "
        "versions (CLUSTER_INVENTORY, UPGRADE_CONTROL_PLANE, UPGRADE_NODE_POOL)."
    )
    preflight: ProviderPart | None = Field(
        default=None,
        description="PreflightUpgrade; default: the upgrades part, when it declares "
        "PREFLIGHT_UPGRADE (otherwise only the composition's own refusals are preflight).",
    )
    health: ProviderPart | None = Field(
        default=None,
        description="Health checks that name no endpoint (CHECK_WORKLOADS or QUERY_METRIC); "
        "default: the inventory part. Asked with the inventory plugin's ids: no clusterId.",
    )

    @model_validator(mode="after")
    def _ids_of_the_run(self) -> ProviderParts:
        for role in ("inventory", "health"):
            part: ProviderPart | None = getattr(self, role)
            if part is not None and part.template != CLUSTER_ID_PLACEHOLDER:
                raise ValueError(
                    f"parts.{role}.clusterId: the {role} part is asked with the inventory "
                    "plugin's ids; remove clusterId"
                )
        return self


class FleetProviderSpec(_Model):
    """A provider plugin a platform admin declares, and the namespaces that may use it."""

    endpoint: str | None = Field(
        default=None,
        pattern=ENDPOINT_PATTERN,
        description="host:port or unix:/path (exactly one of endpoint and parts).",
    )
    insecure: bool = Field(default=False, description="true: plaintext gRPC; false: TLS.")
    tls: TLSConfig | None = Field(
        default=None, description="TLS; its Secrets are read in the orchestrator's namespace."
    )
    parts: ProviderParts | None = Field(
        default=None,
        description="A provider composed of one FleetProvider per capability (exactly one of "
        "endpoint and parts).",
    )
    allowed_namespaces: AllowedNamespaces = Field(
        description="Who may name this provider in spec.providerRef (nobody when empty)."
    )

    model_config = _Model.model_config | {
        "json_schema_extra": {"oneOf": [{"required": ["endpoint"]}, {"required": ["parts"]}]}
    }

    @model_validator(mode="after")
    def _endpoint_or_parts(self) -> FleetProviderSpec:
        if (self.endpoint is None) == (self.parts is None):
            raise ValueError("set exactly one of spec.endpoint and spec.parts")
        if self.parts is not None and (self.insecure or self.tls is not None):
            raise ValueError(
                "spec.insecure and spec.tls belong to each part's own FleetProvider; remove them"
            )
        return self

    def part(self, role: str) -> ProviderPart | None:
        """The part named for role (None: not composed, or an optional role left out)."""
        return None if self.parts is None else getattr(self.parts, role)
