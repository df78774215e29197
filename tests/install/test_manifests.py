"""The install manifests: they build, the apiserver accepts them, RBAC is least privilege."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.controlplane import REPO_ROOT
from tests.install.served import as_served
from tests.support.kube import KubeCluster
from tests.support.kubectl import kubectl, kustomize, yaml_docs

MANIFESTS = REPO_ROOT / "manifests"
INSTALL = MANIFESTS / "install"
#: What `make image` builds here (scripts/build-image --print-name); the images: entry of
#: manifests/install/kustomization.yaml sets it on every container.
IMAGE = "localhost/fleet-upgrade/orchestrator:0.1.0"
SA = ("fleet-upgrade-system", "fleet-orchestrator")
#: The CRDs the orchestrator's controllers need; manifests/crds may hold more (all installed).
CORE_CRDS = {
    "clusterversions.multicluster-ops.io",
    "updateruns.multicluster-ops.io",
    "clusterupgrades.multicluster-ops.io",
}

#: Everything the orchestrator's ServiceAccount may do, and nothing more:
#: (namespace or "*" for cluster-wide, API group, resource, verb).
EXPECTED_GRANTS = {
    *(
        ("*", "multicluster-ops.io", "clusterversions", v)
        for v in ("get", "list", "watch", "patch")
    ),
    *(
        ("*", "multicluster-ops.io", status, v)
        for status in ("clusterversions/status", "updateruns/status", "clusterupgrades/status")
        for v in ("get", "patch", "update")
    ),
    # The ClusterVersion controller creates, stops (patch) and prunes (delete) UpdateRuns; the
    # UpdateRun controller creates a run's ClusterUpgrades, pruning deletes them.
    *(
        ("*", "multicluster-ops.io", "updateruns", v)
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ),
    # patch: the finalizer multicluster-ops.io/back-in-service (orchestrator.pipeline.deletion).
    *(
        ("*", "multicluster-ops.io", "clusterupgrades", v)
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ),
    # ownerReferences with blockOwnerDeletion on the runs and ClusterUpgrades it creates.
    ("*", "multicluster-ops.io", "clusterversions/finalizers", "update"),
    ("*", "multicluster-ops.io", "updateruns/finalizers", "update"),
    ("*", "", "events", "create"),
    ("*", "", "events", "patch"),
    # Who may do what: the admins' FleetProviders and MetricSources (cluster-scoped), and
    # namespace labels for their allowedNamespaces selectors.
    *(
        ("*", "multicluster-ops.io", kind, v)
        for kind in ("fleetproviders", "metricsources")
        for v in ("get", "list", "watch")
    ),
    ("*", "", "namespaces", "get"),
    # Secrets only in the orchestrator's own namespace (never cluster-wide): the providers'
    # TLS material, and the admission webhook's self-managed certificate (create/update).
    *(("fleet-upgrade-system", "", "secrets", v) for v in ("get", "create", "update")),
    # The webhook injects its CA into its own Validating- and MutatingWebhookConfiguration (by
    # name).
    *(
        ("*", "admissionregistration.k8s.io", kind, v)
        for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")
        for v in ("get", "patch")
    ),
    *(
        ("fleet-upgrade-system", "coordination.k8s.io", "leases", v)
        for v in ("get", "create", "update")
    ),
    # Job hooks of runs in the orchestrator's own namespace (created, then read by name);
    # other namespaces opt in with manifests/overlays/hook-jobs.
    *(("fleet-upgrade-system", "batch", "jobs", v) for v in ("create", "get")),
}
#: Kinds without a namespace.
CLUSTER_SCOPED = {"Namespace", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for doc in docs:
        out[doc["kind"]].append(doc)
    return out


def _dry_run(cluster: KubeCluster, yaml_text: str, *args: str) -> list[str]:
    # The policy/v1 PodDisruptionBudget as v1beta1 on the local 1.20 apiserver (served.py).
    yaml_text = yaml.safe_dump_all(as_served(cluster, yaml_docs(yaml_text)))
    out = kubectl(cluster, "apply", "--dry-run=server", *args, "-f", "-", stdin=yaml_text)
    return [line for line in out.splitlines() if line.strip()]


def test_everything_builds_and_the_apiserver_accepts_it(
    control_plane: KubeCluster, install_namespace: str
) -> None:
    rendered = kustomize(MANIFESTS)
    docs = yaml_docs(rendered)
    kinds = _by_kind(docs)
    assert set(kinds) == {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
    built = {c["metadata"]["name"]: c for c in kinds["CustomResourceDefinition"]}
    files = {p.stem: p for p in (MANIFESTS / "crds").glob("*.yaml")}
    assert set(files) >= CORE_CRDS
    assert sorted(built) == sorted(files)  # every generated CRD is in the build, once
    assert len(kinds["CustomResourceDefinition"]) == len(files)
    for name, path in files.items():
        assert built[name] == yaml_docs([path])[0], name  # each CRD as generated, unchanged
    lines = _dry_run(control_plane, rendered)
    assert len(lines) == len(docs), lines
    assert all(line.endswith("(server dry run)") for line in lines), lines


def test_the_controller_install_alone_and_each_file_are_accepted(
    control_plane: KubeCluster, install_namespace: str
) -> None:
    rendered = kustomize(INSTALL)
    assert "CustomResourceDefinition" not in _by_kind(yaml_docs(rendered))
    assert len(_dry_run(control_plane, rendered)) == len(yaml_docs(rendered))
    files = sorted(p for p in INSTALL.glob("*.yaml") if p.name != "kustomization.yaml")
    listed = yaml_docs([INSTALL / "kustomization.yaml"])[0]["resources"]
    assert sorted(listed) == [p.name for p in files], "a file under install/ is not in the build"
    for path in files:
        lines = _dry_run(control_plane, path.read_text())
        assert len(lines) == len(yaml_docs([path])), (path, lines)


def _rules_of(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["kind"] + "/" + d["metadata"]["name"], rule)
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for rule in d.get("rules") or []
    ]


def test_rbac_has_no_wildcards() -> None:
    docs = yaml_docs(kustomize(INSTALL))
    rules = _rules_of(docs)
    assert rules
    for where, rule in rules:
        for key in ("verbs", "resources", "apiGroups", "resourceNames"):
            assert "*" not in (rule.get(key) or []), f"{where}: '*' in {key}"
        assert not rule.get("nonResourceURLs"), f"{where}: nonResourceURLs"
        assert rule.get("verbs") and rule.get("resources"), f"{where}: empty rule"
    for doc in docs:
        if doc["kind"] == "ClusterRole":
            assert "aggregationRule" not in doc, doc["metadata"]["name"]


def _grants(docs: list[dict[str, Any]], subject: tuple[str, str]) -> set[tuple[str, ...]]:
    """What the bindings in docs give a ServiceAccount, as (namespace|*, group, resource, verb)."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    grants: set[tuple[str, ...]] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and (s.get("namespace"), s["name"]) == subject
            for s in binding["subjects"]
        ):
            continue
        scope = binding["metadata"].get("namespace") or "*"
        ref = binding["roleRef"]
        role_ns = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        role = roles[(ref["kind"], role_ns, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.add((scope, group, resource, verb))
    return grants


def test_the_service_account_gets_exactly_what_the_orchestrator_uses() -> None:
    docs = yaml_docs(kustomize(INSTALL))
    assert _grants(docs, SA) == EXPECTED_GRANTS
    deployment = _by_kind(docs)["Deployment"][0]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == SA[1]
    (account,) = _by_kind(docs)["ServiceAccount"]
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == SA


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    )


def test_deployment_runs_the_orchestrator_with_the_sim_sidecar() -> None:
    kinds = _by_kind(yaml_docs(kustomize(INSTALL)))
    (deployment,) = kinds["Deployment"]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2  # one leads (--enable-leader-election), one stands by
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    main = _container(deployment, "orchestrator")
    assert main["image"] == IMAGE
    assert main["command"] == ["fleet-orchestrator"]
    assert main["args"] == [
        "run",
        "--enable-leader-election",
        "--metrics-addr",
        ":8080",
        "--sync-period-seconds",
        "30",
        "--webhook-addr",
        ":9443",
    ]
    env = {e["name"]: e for e in main["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == {
        "metrics": 8080,
        "webhook": 9443,
    }
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    sidecar = _container(deployment, "plugin-sim")
    assert sidecar["image"] == IMAGE and sidecar["command"] == ["fleet-plugin-sim"]
    listen = sidecar["args"][sidecar["args"].index("--listen") + 1]
    assert listen == "127.0.0.1:9090"  # loopback only: reachable from this pod alone
    for container in (main, sidecar):
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True, container["name"]
        assert ctx["allowPrivilegeEscalation"] is False, container["name"]
        assert ctx["capabilities"]["drop"] == ["ALL"], container["name"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
        assert "memory" in container["resources"]["limits"], container["name"]
        assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (service,) = [s for s in kinds["Service"] if s["metadata"]["name"].endswith("-metrics")]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}["metrics"] == "metrics"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in INSTALL.glob("*.yaml") if p.name != "kustomization.yaml"),
    ids=lambda p: p.name,
)
def test_install_objects_live_in_the_install_namespace(path: Path) -> None:
    for doc in yaml_docs([path]):
        if doc["kind"] in CLUSTER_SCOPED or doc["kind"].startswith("Cluster"):
            assert "namespace" not in doc["metadata"], path.name
        else:
            assert doc["metadata"].get("namespace") == "fleet-upgrade-system", path.name
