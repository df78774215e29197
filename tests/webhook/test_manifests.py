"""The webhook as shipped: a configuration that can block nothing else, wired to the Deployment's
webhook port, and the cert-manager overlay (kubectl kustomize; no apiserver needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator import api
from tests.support.kubectl import kustomize, yaml_docs

ROOT = Path(__file__).resolve().parents[2]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return out


def orchestrator_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "orchestrator")


def test_the_configuration_matches_only_our_kinds_and_fails_open_fast() -> None:
    kinds = by_kind(yaml_docs(kustomize(ROOT / "manifests" / "install")))
    (hook,) = kinds["ValidatingWebhookConfiguration"]["fleet-orchestrator"]["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 5
    assert hook["sideEffects"] == "None"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert "caBundle" not in hook["clientConfig"]  # injected, never shipped
    (rule,) = hook["rules"]
    assert rule["apiGroups"] == [api.GROUP] and rule["apiVersions"] == [api.VERSION]
    assert sorted(rule["resources"]) == [api.PLURAL, api.UPDATE_RUN_PLURAL]  # no /status
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]


def test_the_service_reaches_the_port_every_replica_serves() -> None:
    kinds = by_kind(yaml_docs(kustomize(ROOT / "manifests" / "install")))
    (hook,) = kinds["ValidatingWebhookConfiguration"]["fleet-orchestrator"]["webhooks"]
    ref = hook["clientConfig"]["service"]
    service = kinds["Service"][ref["name"]]
    assert service["metadata"]["namespace"] == ref["namespace"] == "fleet-upgrade-system"
    assert ref["path"] == "/validate"
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"] == 443]
    deployment = kinds["Deployment"]["fleet-orchestrator"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    main = orchestrator_container(deployment)
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports[port["targetPort"]] == 9443
    args = main["args"]
    assert args[args.index("--webhook-addr") + 1] == ":9443"
    assert "--webhook-cert-dir" not in args  # self-managed by default
    # Self-managed certificates: get/patch on that one configuration, by name.
    (rule,) = kinds["ClusterRole"]["fleet-orchestrator-webhook"]["rules"]
    assert rule["resourceNames"] == ["fleet-orchestrator"]
    assert sorted(rule["verbs"]) == ["get", "patch"]


def test_the_cert_manager_overlay_serves_cert_managers_certificate() -> None:
    kinds = by_kind(yaml_docs(kustomize(ROOT / "manifests" / "overlays" / "cert-manager")))
    config = kinds["ValidatingWebhookConfiguration"]["fleet-orchestrator"]
    certificate = kinds["Certificate"]["fleet-orchestrator-webhook"]
    namespace = certificate["metadata"]["namespace"]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{namespace}/fleet-orchestrator-webhook"
    )
    assert certificate["spec"]["issuerRef"]["name"] in kinds["Issuer"]
    service = config["webhooks"][0]["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    deployment = kinds["Deployment"]["fleet-orchestrator"]
    main = orchestrator_container(deployment)
    directory = main["args"][main["args"].index("--webhook-cert-dir") + 1]
    (mount,) = [m for m in main["volumeMounts"] if m["mountPath"] == directory]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert mount["readOnly"] is True
    # What only self-managed certificates need is left out.
    assert "fleet-orchestrator-webhook" not in kinds.get("ClusterRole", {})
    assert "fleet-orchestrator-webhook-tls" not in kinds.get("Role", {})
    assert "fleet-orchestrator-webhook" not in kinds.get("ClusterRoleBinding", {})
    assert "fleet-orchestrator-webhook-tls" not in kinds.get("RoleBinding", {})
