"""spec.providerRefs: a run over several FleetProviders, each one checked like providerRef."""

from __future__ import annotations

from orchestrator import api
from orchestrator.adapters.webhook import admit, denial_message
from orchestrator.engine.access import check_access
from orchestrator.engine.validate import Problem
from tests.access.test_rules import POLICY, allowed, checks, cv, problems, provider

PROVIDERS = {
    "gke-prod": provider("gke-plugin:9000"),
    "eks-prod": provider("eks-plugin:9000"),
    "aks-prod": provider("aks-plugin:9000", allowedNamespaces={"names": ["team-b"]}),
}


def test_several_providers_are_allowed_in_the_specs_order() -> None:
    spec = cv(providerRefs=[{"name": "gke-prod"}, {"name": "eks-prod"}])
    access = allowed(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    assert [(n, e.endpoint, e.via) for n, e in access.members] == [
        ("gke-prod", "gke-plugin:9000", "FleetProvider gke-prod"),
        ("eks-prod", "eks-plugin:9000", "FleetProvider eks-prod"),
    ]
    assert access.provider.endpoint == "gke-plugin:9000"


def test_each_provider_is_checked_and_named() -> None:
    spec = cv(providerRefs=[{"name": "gke-prod"}, {"name": "aks-prod"}, {"name": "nope"}])
    found = problems(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    assert (
        "FleetProvider aks-prod does not allow namespace team-a"
        in (found["spec.providerRefs[1].name"])
    )
    assert "FleetProvider nope does not exist" in found["spec.providerRefs[2].name"]
    assert "spec.providerRefs[0].name" not in found


def test_provider_refs_are_exclusive_with_provider_ref_and_ops_endpoint() -> None:
    spec = cv(
        providerRefs=[{"name": "gke-prod"}],
        providerRef={"name": "eks-prod"},
        opsEndpoint={"endpoint": "x:1", "insecure": True},
    )
    found = problems(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    message = found["spec.providerRefs"]
    assert "set one of providerRefs, providerRef or opsEndpoint" in message
    assert "remove providerRef and opsEndpoint" in message


def test_a_provider_listed_twice_is_refused() -> None:
    spec = cv(providerRefs=[{"name": "gke-prod"}, {"name": "gke-prod"}])
    found = problems(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    assert found == {
        "spec.providerRefs[1].name": "FleetProvider gke-prod is listed twice; list each once"
    }


def test_a_check_must_name_its_plugin_in_a_run_over_several() -> None:
    workloads = {"name": "app", "workloads": {"items": [{"namespace": "default", "name": "app"}]}}
    spec = cv(
        providerRefs=[{"name": "gke-prod"}, {"name": "eks-prod"}], healthChecks=checks(workloads)
    )
    found = problems(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    assert (
        "is required in a run over several FleetProviders"
        in (found["spec.healthChecks.checks[0].workloads.endpoint"])
    )
    # Naming one of them is allowed (the plugin a FleetProvider declares).
    named = {**workloads, "workloads": {**workloads["workloads"], "endpoint": "eks-plugin:9000"}}
    spec = cv(providerRefs=[{"name": "gke-prod"}, {"name": "eks-prod"}], healthChecks=checks(named))
    access = allowed(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    assert access.plugin("eks-plugin:9000", None, None).via == "FleetProvider eks-prod"


def test_the_update_run_spec_has_them_too() -> None:
    spec = api.UpdateRunSpec.model_validate(
        {"providerRefs": [{"name": "gke-prod"}, {"name": "eks-prod"}], "version": "1.29.1"}
    )
    access = allowed(check_access("team-a", spec, PROVIDERS, {}, POLICY))
    assert [n for n, _ in access.members] == ["gke-prod", "eks-prod"]


def test_admission_refuses_provider_refs_beside_provider_ref_naming_the_fields() -> None:
    body = {
        "providerRefs": [{"name": "gke-prod"}, {"name": "eks-prod"}],
        "providerRef": {"name": "gke-prod"},
        "clusters": [{"id": "a", "version": "1.29.4"}, {"id": "b", "version": "1.29.4"}],
    }
    request = {
        "operation": "CREATE",
        "kind": {"kind": api.KIND},
        "namespace": "team-a",
        "object": {"metadata": {"namespace": "team-a"}, "spec": body},
    }

    def access(ns: str, spec: api.ClusterVersionSpec | api.UpdateRunSpec) -> list[Problem]:
        found = check_access(ns, spec, PROVIDERS, {}, POLICY)
        return found if isinstance(found, list) else []

    refused = admit(request, access)
    assert [p.field for p in refused] == ["spec.providerRefs"]
    assert "set one of providerRefs, providerRef or opsEndpoint" in denial_message(refused)
    del body["providerRef"]
    assert admit(request, access) == []
