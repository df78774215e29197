"""A composed FleetProvider: its schema (api.FleetProviderSpec), who may use its parts
(engine.access), the capabilities its parts must declare (pipeline.compose), and the ids of
the clusters on each part (pipeline.compose.part_id)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator import api
from orchestrator.api.crd import fleet_provider_crd
from orchestrator.engine.access import Access, AccessPolicy, check_access
from orchestrator.engine.observations import ClusterObs
from orchestrator.engine.validate import Problem
from orchestrator.pipeline.compose import Unmapped, missing_capabilities, part_id

HOME = "fleet-upgrade-system"
POLICY = AccessPolicy.default(HOME)
AKS_ID = (
    "/subscriptions/{label:fleet.azure.com/subscription-id}/resourceGroups/"
    "{label:fleet.azure.com/resource-group|lower}/providers/Microsoft.ContainerService/"
    "managedClusters/{label:fleet.azure.com/cluster-name|lower}"
)


def composed(**parts: Any) -> dict[str, Any]:
    body = {
        "inventory": {"name": "kubefleet-hub"},
        "traffic": {"name": "kubefleet-hub"},
        "upgrades": {"name": "aks-prod", "clusterId": AKS_ID},
        **parts,
    }
    return {"parts": body, "allowedNamespaces": {"names": ["team-a"]}}


def spec(body: dict[str, Any]) -> api.FleetProviderSpec:
    return api.FleetProviderSpec.model_validate(body)


def plugin(endpoint: str, **extra: Any) -> api.FleetProviderSpec:
    # Parts allow nobody on their own: only the composed FleetProvider's namespaces count.
    return spec({"endpoint": endpoint, "allowedNamespaces": {}, **extra})


PROVIDERS: dict[str, api.FleetProviderSpec | None] = {
    "kubefleet-hub": plugin("kubefleet.fleet-system:9090", insecure=True),
    "aks-prod": plugin("localhost:9091", insecure=True),
    "kf-aks": spec(composed()),
}


def run(name: str = "kf-aks") -> api.ClusterVersionSpec:
    return api.ClusterVersionSpec.model_validate(
        {"clusters": [{"id": "member-1", "version": "1.30.3"}], "providerRef": {"name": name}}
    )


def refusal(result: Access | list[Problem]) -> str:
    assert isinstance(result, list) and result, f"expected a refusal, got {result}"
    return "; ".join(str(p) for p in result)


# -- the schema --------------------------------------------------------------------------------


def test_a_fleet_provider_has_an_endpoint_or_parts_never_both_nor_neither() -> None:
    with pytest.raises(ValidationError, match=r"exactly one of spec.endpoint and spec.parts"):
        spec({**composed(), "endpoint": "localhost:9090"})
    with pytest.raises(ValidationError, match=r"exactly one of spec.endpoint and spec.parts"):
        spec({"allowedNamespaces": {}})
    with pytest.raises(ValidationError, match=r"spec.insecure and spec.tls belong to each part"):
        spec({**composed(), "insecure": True})
    # The CRD says it too (the apiserver refuses such an object before anyone reads it).
    schema = fleet_provider_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["oneOf"] == [
        {"required": ["endpoint"]},
        {"required": ["parts"]},
    ]
    parts = schema["properties"]["spec"]["properties"]["parts"]
    assert sorted(parts["required"]) == ["inventory", "traffic", "upgrades"]


def test_a_composition_needs_inventory_traffic_and_upgrades() -> None:
    body = composed()
    del body["parts"]["traffic"]
    with pytest.raises(ValidationError, match=r"parts.traffic"):
        spec(body)


def test_the_inventory_and_health_parts_take_no_cluster_id() -> None:
    with pytest.raises(ValidationError, match=r"parts.inventory.clusterId: .*remove clusterId"):
        spec(composed(inventory={"name": "kubefleet-hub", "clusterId": "x-{id}"}))
    with pytest.raises(ValidationError, match=r"parts.health.clusterId"):
        spec(composed(health={"name": "kubefleet-hub", "clusterId": "x-{id}"}))


@pytest.mark.parametrize("template", ["{name}", "{label:}", "a{id", "{label:a b}", "{id|upper}"])
def test_a_cluster_id_template_names_only_id_and_labels(template: str) -> None:
    with pytest.raises(ValidationError, match="clusterId"):
        spec(composed(upgrades={"name": "aks-prod", "clusterId": template}))
    # The CRD's pattern refuses it too (the same expression, kept to what RE2 accepts).
    assert not re.fullmatch(api.CLUSTER_ID_TEMPLATE_PATTERN, template)


# -- ids on each part -------------------------------------------------------------------------


def member(name: str, **labels: str) -> ClusterObs:
    return ClusterObs(id=name, control_plane_version="1.29.7", labels=labels)


FLEET_LABELS = {
    "fleet.azure.com/subscription-id": "00000000-0000-0000-0000-0000000000a1",
    "fleet.azure.com/resource-group": "Fleet-RG",
    "fleet.azure.com/cluster-name": "AKS-1",
}


def test_a_members_aks_resource_id_is_made_from_the_labels_fleet_manager_puts_on_it() -> None:
    assert part_id(AKS_ID, member("member-1", **FLEET_LABELS)) == (
        "/subscriptions/00000000-0000-0000-0000-0000000000a1/resourceGroups/fleet-rg/providers/"
        "Microsoft.ContainerService/managedClusters/aks-1"
    )
    assert part_id("{id}", member("member-1")) == "member-1"
    assert part_id("arn:aws:eks:eu-west-1:123456789012:cluster/{id}", member("c1")) == (
        "arn:aws:eks:eu-west-1:123456789012:cluster/c1"
    )


def test_a_missing_or_empty_label_is_named() -> None:
    labels = dict(FLEET_LABELS)
    del labels["fleet.azure.com/resource-group"]
    found = part_id(AKS_ID, member("member-1", **labels))
    assert isinstance(found, Unmapped)
    assert "no label fleet.azure.com/resource-group" in found.message
    labels["fleet.azure.com/resource-group"] = ""
    found = part_id(AKS_ID, member("member-1", **labels))
    assert isinstance(found, Unmapped) and "fleet.azure.com/resource-group" in found.message


# -- who may use the parts --------------------------------------------------------------------


def test_a_composed_provider_resolves_every_part_and_its_defaults() -> None:
    access = check_access("team-a", run(), PROVIDERS, {}, POLICY)
    assert isinstance(access, Access) and access.composition is not None
    parts = access.composition.parts
    assert {r: (p.name, p.endpoint.endpoint, p.named) for r, p in parts.items()} == {
        "inventory": ("kubefleet-hub", "kubefleet.fleet-system:9090", True),
        "traffic": ("kubefleet-hub", "kubefleet.fleet-system:9090", True),
        "upgrades": ("aks-prod", "localhost:9091", True),
        # Defaults: preflight from the upgrades part (its ids), health from the inventory's.
        "preflight": ("aks-prod", "localhost:9091", False),
        "health": ("kubefleet-hub", "kubefleet.fleet-system:9090", False),
    }
    assert parts["preflight"].template == AKS_ID
    assert parts["health"].template == "{id}"
    # Checks naming no endpoint ask the health part; TLS Secrets are the orchestrator's.
    assert access.provider.endpoint == "kubefleet.fleet-system:9090"
    assert {p.endpoint.secret_namespace for p in parts.values()} == {HOME}
    # The parts allow nobody themselves: naming one directly is refused.
    assert "does not allow namespace team-a" in refusal(
        check_access("team-a", run("aks-prod"), PROVIDERS, {}, POLICY)
    )


def test_the_composed_providers_namespaces_are_the_ones_that_count() -> None:
    assert "does not allow namespace team-b" in refusal(
        check_access("team-b", run(), PROVIDERS, {}, POLICY)
    )


@pytest.mark.parametrize(
    ("providers", "words"),
    [
        ({"kubefleet-hub": None}, "spec.parts.inventory.name: FleetProvider kubefleet-hub has an"),
        (
            {"aks-prod": "missing"},
            "spec.parts.upgrades.name: FleetProvider aks-prod does not exist",
        ),
        (
            {"aks-prod": spec(composed())},
            "spec.parts.upgrades.name: FleetProvider aks-prod is itself composed",
        ),
    ],
)
def test_a_part_that_is_not_a_plugin_refuses_the_run_naming_the_field(
    providers: dict[str, Any], words: str
) -> None:
    declared = dict(PROVIDERS)
    for name, value in providers.items():
        if value == "missing":
            del declared[name]
        else:
            declared[name] = value
    text = refusal(check_access("team-a", run(), declared, {}, POLICY))
    assert "spec.providerRef.name: FleetProvider kf-aks: " in text
    assert words in text


# -- capabilities -----------------------------------------------------------------------------

KUBEFLEET = frozenset({"CLUSTER_INVENTORY", "CLUSTER_SERVICE", "CHECK_WORKLOADS", "GATES"})
AKS = frozenset(
    {"CLUSTER_INVENTORY", "UPGRADE_CONTROL_PLANE", "UPGRADE_NODE_POOL", "PREFLIGHT_UPGRADE"}
)
ROLES = {
    "inventory": ("kubefleet-hub", True),
    "traffic": ("kubefleet-hub", True),
    "upgrades": ("aks-prod", True),
    "preflight": ("aks-prod", False),
    "health": ("kubefleet-hub", False),
}


def test_kubefleet_for_inventory_and_taints_with_aks_for_upgrades_declares_enough() -> None:
    assert (
        missing_capabilities("kf-aks", ROLES, {"kubefleet-hub": KUBEFLEET, "aks-prod": AKS}) == []
    )


def test_a_part_lacking_its_roles_capability_is_named_with_what_it_lacks() -> None:
    # Swapped: KubeFleet upgrades nothing, and AKS without traffic.mode serves no traffic.
    roles = {**ROLES, "traffic": ("aks-prod", True), "upgrades": ("kubefleet-hub", True)}
    found = missing_capabilities("kf-aks", roles, {"kubefleet-hub": KUBEFLEET, "aks-prod": AKS})
    assert found == [
        "FleetProvider kf-aks: part traffic (FleetProvider aks-prod) does not declare capability "
        "CLUSTER_SERVICE; name a plugin that does in spec.parts.traffic",
        "FleetProvider kf-aks: part upgrades (FleetProvider kubefleet-hub) does not declare "
        "capability UPGRADE_CONTROL_PLANE; name a plugin that does in spec.parts.upgrades",
        "FleetProvider kf-aks: part upgrades (FleetProvider kubefleet-hub) does not declare "
        "capability UPGRADE_NODE_POOL; name a plugin that does in spec.parts.upgrades",
    ]


def test_a_defaulted_part_lacking_the_capability_is_unused_not_refused() -> None:
    no_preflight = AKS - {"PREFLIGHT_UPGRADE"}
    declared = {"kubefleet-hub": KUBEFLEET - {"CHECK_WORKLOADS"}, "aks-prod": no_preflight}
    assert missing_capabilities("kf-aks", ROLES, declared) == []
    named = {**ROLES, "preflight": ("aks-prod", True), "health": ("kubefleet-hub", True)}
    found = missing_capabilities("kf-aks", named, declared)
    assert [m.split(" does not declare capability ")[1].split(";")[0] for m in found] == [
        "PREFLIGHT_UPGRADE",
        "CHECK_WORKLOADS or QUERY_METRIC",
    ]


def test_a_composed_provider_is_refused_among_several_naming_it() -> None:
    """providerRefs takes FleetProviders with an endpoint: a composed one there would be run as
    its health part alone, so it is refused, named, with the fix."""
    gke = spec({"endpoint": "gke:9000", "allowedNamespaces": {"names": ["team-a"]}})
    several = {**PROVIDERS, "gke-prod": gke}
    body = {
        "clusters": [{"id": "member-1", "version": "1.30.3"}],
        "providerRefs": [{"name": "gke-prod"}, {"name": "kf-aks"}],
    }
    result = check_access(
        "team-a", api.ClusterVersionSpec.model_validate(body), several, {}, POLICY
    )
    message = refusal(result)
    assert "spec.providerRefs[1].name" in message
    assert "FleetProvider kf-aks is composed (spec.parts)" in message
    assert "name it alone in spec.providerRef" in message
