"""The shipped RBAC grants nothing by default that "Who may do what" forbids; the opt-in
overlays add exactly what they say."""

from __future__ import annotations

from typing import Any

from devtools.controlplane import REPO_ROOT
from tests.install.test_manifests import _grants
from tests.support.kubectl import kustomize, yaml_docs

MANIFESTS = REPO_ROOT / "manifests"
SA = ("fleet-upgrade-system", "fleet-orchestrator")
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def _docs(path: str) -> list[dict[str, Any]]:
    return yaml_docs(kustomize(MANIFESTS / path))


def _aggregated(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    return {
        d["metadata"]["name"]: {
            k.removeprefix(AGGREGATE)
            for k in (d["metadata"].get("labels") or {})
            if k.startswith(AGGREGATE)
        }
        for d in docs
        if d["kind"] == "ClusterRole"
    }


def test_nothing_is_aggregated_into_built_in_roles_by_default() -> None:
    assert not any(_aggregated(_docs("install")).values())


def test_the_orchestrator_reads_secrets_only_in_its_namespace_by_default() -> None:
    grants = _grants(_docs("install"), SA)
    secrets = {(ns, verb) for ns, group, resource, verb in grants if resource == "secrets"}
    assert ("fleet-upgrade-system", "get") in secrets
    assert {ns for ns, _ in secrets} == {"fleet-upgrade-system"}  # never cluster-wide
    declared = {
        (ns, resource, verb)
        for ns, group, resource, verb in grants
        if resource in ("fleetproviders", "metricsources")
    }
    assert declared == {
        ("*", r, v) for r in ("fleetproviders", "metricsources") for v in ("get", "list", "watch")
    }
    writes = {"create", "update", "patch", "delete"}
    assert not any(
        r in ("fleetproviders", "metricsources") and v in writes for _, _, r, v in grants
    )


def test_the_aggregate_overlay_aggregates_the_people_roles_only() -> None:
    aggregated = _aggregated(_docs("overlays/aggregate-to-builtin-roles"))
    assert aggregated["fleet-clusterversion-viewer"] == {"view"}
    assert aggregated["fleet-clusterversion-editor"] == {"edit", "admin"}
    others = {name: labels for name, labels in aggregated.items() if "clusterversion" not in name}
    assert not any(others.values()), others  # never the provider roles, never the orchestrator's


def test_the_inline_tls_overlay_allows_one_more_namespace_and_its_secrets() -> None:
    docs = _docs("overlays/inline-tls-secrets")
    grants = _grants(docs, SA)
    secrets = {(ns, verb) for ns, group, resource, verb in grants if resource == "secrets"}
    assert {ns for ns, _ in secrets} == {"fleet-upgrade-system", "team-a"}
    assert {verb for ns, verb in secrets if ns == "team-a"} == {"get"}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    orchestrator = deployment["spec"]["template"]["spec"]["containers"][0]
    assert orchestrator["name"] == "orchestrator"
    assert "--allow-inline-endpoints-in=fleet-upgrade-system,team-a" in orchestrator["args"]
