"""manifests/compose: the composed providers as shipped. Each kustomization builds a pod with
both plugins where its FleetProviders point; the sidecar patches are the plugins' own (kustomize
loads no file outside a kustomization's directory, so they are copies, kept equal here); the
FleetProviders and ClusterVersions are accepted by the real apiserver and by the access rule;
the clusterId templates make ids the upgrades plugins accept. The apiserver also refuses a
FleetProvider with both an endpoint and parts, or neither, naming the field."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.controlplane import REPO_ROOT
from orchestrator import api
from orchestrator.engine.access import Access, AccessPolicy, check_access
from orchestrator.engine.observations import ClusterObs
from orchestrator.engine.validate import parse_spec, validate_spec
from orchestrator.pipeline.compose import part_id
from plugins.aks.ids import parse_cluster_id as aks_cluster
from plugins.eks.ids import parse_cluster_id as eks_cluster
from tests.support.kube import KubeCluster
from tests.support.kubectl import kubectl, yaml_docs

COMPOSE = REPO_ROOT / "manifests" / "compose"
KINDS = ("kubefleet-aks", "ocm-eks")


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def providers(kind: str) -> dict[str, api.FleetProviderSpec | None]:
    return {
        d["metadata"]["name"]: api.FleetProviderSpec.model_validate(d["spec"])
        for d in docs(COMPOSE / kind / "fleetproviders.yaml")
    }


def built(kind: str) -> list[dict[str, Any]]:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [binary, "kustomize", str(COMPOSE / kind)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def containers(kind: str) -> dict[str, dict[str, Any]]:
    (deployment,) = [d for d in built(kind) if d["kind"] == "Deployment"]
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def listens(container: dict[str, Any]) -> str:
    args = [str(a) for a in container.get("args") or []]
    for i, arg in enumerate(args):
        if arg.startswith("--listen="):
            return arg.split("=", 1)[1]
        if arg == "--listen":
            return args[i + 1]
    raise AssertionError(f"{container['name']} has no --listen")


@pytest.mark.parametrize("kind", KINDS)
def test_the_pod_serves_every_part_where_its_fleet_provider_points(kind: str) -> None:
    pod = containers(kind)
    served = {listens(c) for name, c in pod.items() if name != "orchestrator"}
    endpoints = {p.endpoint for p in providers(kind).values() if p is not None and p.endpoint}
    assert endpoints and endpoints <= served, (endpoints, served)
    ports = [
        p["containerPort"]
        for c in pod.values()
        for p in c.get("ports") or []
        if "containerPort" in p
    ]
    assert len(ports) == len(set(ports)), f"two containers of one pod share a port: {ports}"
    # The FleetProviders ship with the pod.
    assert {d["metadata"]["name"] for d in built(kind) if d["kind"] == "FleetProvider"} == set(
        providers(kind)
    )


def test_the_sidecar_patches_are_the_plugins_own() -> None:
    assert (COMPOSE / "kubefleet-aks" / "kubefleet-sidecar-patch.yaml").read_text() == (
        REPO_ROOT / "manifests" / "kubefleet" / "orchestrator-sidecar-patch.yaml"
    ).read_text()
    ours = (COMPOSE / "ocm-eks" / "ocm-sidecar-patch.yaml").read_text()
    theirs = (REPO_ROOT / "manifests" / "ocm" / "sidecar.yaml").read_text()
    probe = ("httpGet: {path: /metrics, port: ocm-metrics}", "grpc: {port: 50061}")
    assert (
        ours.replace(":9092", ":9091")
        .replace("containerPort: 9092", "containerPort: 9091")
        .replace(*probe)
        == theirs
    )


@pytest.mark.parametrize("kind", KINDS)
def test_the_composition_is_allowed_for_its_namespace_and_its_examples_validate(
    kind: str,
) -> None:
    (cv,) = docs(COMPOSE / kind / "clusterversion.yaml")
    spec = parse_spec(cv["spec"])
    assert isinstance(spec, api.ClusterVersionSpec), spec
    assert validate_spec(spec) == []
    found = check_access(
        "team-a", spec, providers(kind), {}, AccessPolicy.default("fleet-upgrade-system")
    )
    assert isinstance(found, Access) and found.composition is not None, found
    assert found.composition.name == kind
    # The parts alone allow nobody.
    for role, part in found.composition.parts.items():
        alone = spec.model_copy(update={"provider_ref": api.ProviderRef(name=part.name)})
        refused = check_access(
            "team-a", alone, providers(kind), {}, AccessPolicy.default("fleet-upgrade-system")
        )
        assert isinstance(refused, list), (role, refused)


def test_the_templates_make_ids_the_upgrades_plugins_accept() -> None:
    aks_template = providers("kubefleet-aks")["kubefleet-aks"]
    assert aks_template is not None and aks_template.parts is not None
    member = ClusterObs(
        id="member-1",
        control_plane_version="1.29.7",
        labels={
            "fleet.azure.com/subscription-id": "00000000-0000-0000-0000-000000000000",
            "fleet.azure.com/resource-group": "Web-RG",
            "fleet.azure.com/cluster-name": "Web-WestEurope",
        },
    )
    made = part_id(aks_template.parts.upgrades.template, member)
    assert isinstance(made, str) and aks_cluster(made) is not None, made
    assert made.endswith(
        "/resourceGroups/web-rg/providers/Microsoft.ContainerService/managedClusters/web-westeurope"
    )
    eks_template = providers("ocm-eks")["ocm-eks"]
    assert eks_template is not None and eks_template.parts is not None
    managed = ClusterObs(
        id="storefront-us-west-2",
        control_plane_version="1.29",
        labels={"clusterclaim/region.open-cluster-management.io": "us-west-2"},
    )
    made = part_id(eks_template.parts.upgrades.template, managed)
    assert made == "arn:aws:eks:us-west-2:111122223333:cluster/storefront-us-west-2"
    assert eks_cluster(made) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_the_apiserver_accepts_the_shipped_objects(
    control_plane: KubeCluster, namespace: str, kind: str
) -> None:
    for name in ("fleetproviders.yaml", "clusterversion.yaml"):
        path = COMPOSE / kind / name
        out = kubectl(control_plane, "apply", "--dry-run=server", "-n", namespace, "-f", str(path))
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == len(yaml_docs([path])), lines
        assert all(line.endswith("(server dry run)") for line in lines), lines


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {
                "endpoint": "127.0.0.1:9090",
                "parts": {
                    "inventory": {"name": "a"},
                    "traffic": {"name": "a"},
                    "upgrades": {"name": "b"},
                },
                "allowedNamespaces": {},
            },
            ("oneOf",),
        ),
        ({"allowedNamespaces": {}}, ("oneOf",)),
        (
            {
                "parts": {"inventory": {"name": "a"}, "upgrades": {"name": "b"}},
                "allowedNamespaces": {},
            },
            ("spec.parts", "traffic"),  # the apiserver's, or kubectl's own schema check
        ),
        (
            {
                "parts": {
                    "inventory": {"name": "a"},
                    "traffic": {"name": "a"},
                    "upgrades": {"name": "b", "clusterId": "{name}"},
                },
                "allowedNamespaces": {},
            },
            ("spec.parts.upgrades.clusterId",),
        ),
    ],
)
def test_the_apiserver_refuses_a_bad_composition_naming_the_field(
    control_plane: KubeCluster, tmp_path: Path, spec: dict[str, Any], words: tuple[str, ...]
) -> None:
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.FLEET_PROVIDER_KIND,
        "metadata": {"name": "bad-composition"},
        "spec": spec,
    }
    path = tmp_path / "fp.json"
    path.write_text(json.dumps(body))
    with pytest.raises(AssertionError) as refused:  # kubectl's failure, with its stderr
        kubectl(control_plane, "apply", "--dry-run=server", "-f", str(path))
    assert all(w in str(refused.value) for w in words), refused.value


def test_kubectl_get_fleetproviders_shows_what_a_composition_is_made_of(
    control_plane: KubeCluster,
) -> None:
    path = COMPOSE / "kubefleet-aks" / "fleetproviders.yaml"
    kubectl(control_plane, "apply", "-f", str(path))
    try:
        out = kubectl(control_plane, "get", "fleetproviders", "kubefleet-aks", "aks-web")
    finally:
        kubectl(control_plane, "delete", "-f", str(path), "--wait=false")
    header, *rows = [line.split() for line in out.splitlines() if line.strip()]
    assert header[:5] == ["NAME", "ENDPOINT", "INSECURE", "INVENTORY", "UPGRADES"], header
    by_name = {row[0]: row for row in rows}
    assert by_name["kubefleet-aks"][-3:-1] == ["kubefleet-hub", "aks-web"], by_name
    assert by_name["aks-web"][1] == "127.0.0.1:9090", by_name
