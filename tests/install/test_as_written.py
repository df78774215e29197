"""The install works as written: the commands of README "Running it" and docs/operations.md
"Install", run against the local kube-apiserver, create every object and bind the RBAC; the
server-side dry runs of every kustomization pass; the `images:` lines render as documented."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devtools.controlplane import REPO_ROOT
from tests.install.served import PDB_V1_MISSING, as_served, serves_policy_v1
from tests.support.kube import KubeCluster
from tests.support.kubectl import kubectl, kustomize, yaml_docs

MANIFESTS = REPO_ROOT / "manifests"
README = REPO_ROOT / "README.md"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
HOME = "fleet-upgrade-system"
SA = f"system:serviceaccount:{HOME}:fleet-orchestrator"
REGISTRY_IMAGE = "registry.example.com/fleet/orchestrator:0.1.0"

#: API groups of other projects' CRDs that overlays use (cert-manager); not installed here.
THIRD_PARTY_GROUPS = {"cert-manager.io"}

#: The install commands, in the order the docs give them; the tests run exactly these.
INSTALL = ["kubectl apply -k manifests/"]
UPGRADE = [
    "kubectl apply --dry-run=server -k manifests/",
    "kubectl apply -f manifests/crds/",
    "kubectl wait --for condition=established --timeout=60s -f manifests/crds/",
    "kubectl apply -k manifests/",
]


def _section(path: Path, title: str) -> str:
    """The text of the Markdown section `## title` (up to the next `## `)."""
    text = path.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def _kubectl_lines(section: str) -> list[str]:
    """The commands of a section's sh blocks that install (kubectl apply/wait of manifests/,
    not of the examples, which tests/install/test_examples.py covers), comments stripped."""
    lines = [
        line.split("#", 1)[0].strip()
        for block in _blocks(section, "sh")
        for line in block.splitlines()
    ]
    return [
        line
        for line in lines
        if line.startswith(("kubectl apply ", "kubectl wait ")) and "manifests/examples" not in line
    ]


def _run(cluster: KubeCluster, command: str) -> subprocess.CompletedProcess[str]:
    """A documented command exactly as written, from the repository root, with KUBECONFIG
    pointing at the local apiserver."""
    return subprocess.run(
        shlex.split(command),
        cwd=REPO_ROOT,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _check_applied(cluster: KubeCluster, done: subprocess.CompletedProcess[str]) -> None:
    """The apply succeeded; on an apiserver older than 1.21 (no policy/v1) it applied all but
    the PodDisruptionBudget, which is then applied as served (tests/install/served.py)."""
    if serves_policy_v1(cluster):
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and PDB_V1_MISSING in errors[0], done.stderr
    pdbs = [d for d in _rendered() if d["kind"] == "PodDisruptionBudget"]
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(as_served(cluster, pdbs)))


def _rendered(directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    return yaml_docs(kustomize(directory))


def _installed(cluster: KubeCluster) -> list[dict[str, Any]]:
    """Every object of the install as the apiserver stores it now (fails if one is missing)."""
    docs = as_served(cluster, _rendered())
    out = kubectl(cluster, "get", "-o", "yaml", "-f", "-", stdin=yaml.safe_dump_all(docs))
    items = yaml.safe_load(out)
    return list(items["items"] if items.get("kind") == "List" else [items])


@pytest.fixture(scope="module")
def fresh(control_plane: KubeCluster) -> Iterator[KubeCluster]:
    """No install yet (the session's CRDs stay; an earlier test's namespace is removed);
    afterwards everything but the CRDs goes."""
    control_plane.delete_namespace(HOME)
    assert HOME not in _existing_namespaces(control_plane)
    yield control_plane
    docs = [
        d
        for d in as_served(control_plane, _rendered())
        if d["kind"] not in ("CustomResourceDefinition", "Namespace")
    ]
    kubectl(
        control_plane,
        *("delete", "--ignore-not-found", "--wait=false", "-f", "-"),
        stdin=yaml.safe_dump_all(docs),
    )
    control_plane.delete_namespace(HOME)


def test_the_docs_give_the_commands_these_tests_run() -> None:
    assert _kubectl_lines(_section(README, "Running it")) == INSTALL
    install = _section(OPERATIONS, "Install")
    commands = _kubectl_lines(install)
    assert commands == [*INSTALL, *UPGRADE], commands
    for command in commands:  # every other line of the sh blocks is a comment or not kubectl
        assert command in install


def test_the_install_as_written_creates_everything_and_binds_the_rbac(
    fresh: KubeCluster,
) -> None:
    for command in INSTALL:
        _check_applied(fresh, _run(fresh, command))
    rendered = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        for d in as_served(fresh, _rendered())
    }
    stored = _installed(fresh)
    assert {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in stored
    } == rendered
    (deployment,) = [d for d in stored if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images == {_build_image_name()}
    (pdb,) = [d for d in stored if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    # The bindings work: the apiserver's own authorizer answers for the ServiceAccount.
    allowed = [
        ("watch", "clusterversions.multicluster-ops.io", None),
        ("patch", "clusterversions.multicluster-ops.io/status", "team-a"),
        ("create", "updateruns.multicluster-ops.io", "team-a"),
        ("delete", "clusterupgrades.multicluster-ops.io", "team-a"),
        ("list", "fleetproviders.multicluster-ops.io", None),
        ("watch", "metricsources.multicluster-ops.io", None),
        ("get", "namespaces", None),
        ("create", "events", "team-a"),
        ("get", "secrets", HOME),
        ("update", "leases.coordination.k8s.io", HOME),
    ]
    refused = [
        ("delete", "clusterversions.multicluster-ops.io", "team-a"),
        ("create", "fleetproviders.multicluster-ops.io", None),
        ("get", "secrets", "team-a"),
        ("list", "secrets", HOME),
        ("update", "leases.coordination.k8s.io", "team-a"),
        ("create", "pods", HOME),
    ]
    for verb, resource, namespace in allowed + refused:
        scope = ["-n", namespace] if namespace else ["--all-namespaces"]
        done = _run(
            fresh, shlex.join(["kubectl", "auth", "can-i", verb, resource, *scope, "--as", SA])
        )
        expected = "yes" if (verb, resource, namespace) in allowed else "no"
        assert done.stdout.strip() == expected, (verb, resource, namespace, done.stderr)


def _build_image_name() -> str:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "build-image"), "--print-name"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def _namespaces_of(docs: list[dict[str, Any]]) -> set[str]:
    return {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}


def test_dry_runs_of_every_kustomization_pass_once_installed(fresh: KubeCluster) -> None:
    """The upgrade commands as written (a server-side dry run, then CRDs first), and a
    server-side dry run of each overlay, with the namespaces they name existing."""
    if not _installed_already(fresh):
        for command in INSTALL:
            _check_applied(fresh, _run(fresh, command))
    for command in UPGRADE:
        done = _run(fresh, command)
        if command.startswith("kubectl apply") and "-k" in command:
            _check_applied(fresh, done)
        else:
            assert done.returncode == 0, (command, done.stderr)
        if "--dry-run=server" in command and done.returncode == 0:
            assert all(
                line.endswith("(server dry run)") for line in done.stdout.splitlines() if line
            ), done.stdout
    overlays = sorted(p.parent for p in MANIFESTS.glob("**/kustomization.yaml"))
    assert {MANIFESTS, MANIFESTS / "install"} < set(overlays)
    created: list[str] = []
    try:
        for directory in overlays:
            docs = as_served(fresh, _rendered(directory))
            # Kinds of another project's CRDs (cert-manager's Issuer and Certificate in
            # overlays/cert-manager) need that project installed: not here.
            foreign = [d for d in docs if d["apiVersion"].split("/")[0] in THIRD_PARTY_GROUPS]
            assert all(d["kind"] in ("Issuer", "Certificate") for d in foreign), foreign
            docs = [d for d in docs if d not in foreign]
            for ns in sorted(_namespaces_of(docs) - _existing_namespaces(fresh)):
                kubectl(fresh, "create", "namespace", ns)
                created.append(ns)
            out = kubectl(
                fresh, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(docs)
            )
            lines = [line for line in out.splitlines() if line.strip()]
            assert len(lines) == len(docs), (directory, out)
            assert all(line.endswith("(server dry run)") for line in lines), (directory, out)
    finally:
        for ns in created:
            fresh.delete_namespace(ns)


def _installed_already(cluster: KubeCluster) -> bool:
    return HOME in _existing_namespaces(cluster)


def _existing_namespaces(cluster: KubeCluster) -> set[str]:
    with cluster.api_client() as client:
        return {n.metadata.name for n in k8s.CoreV1Api(client).list_namespace().items}


def _images(docs: list[dict[str, Any]]) -> set[str]:
    return {
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def test_the_image_is_what_make_image_builds_and_one_line_changes_it(tmp_path: Path) -> None:
    install = _section(OPERATIONS, "Install")
    default_line, registry_line, overlay = _blocks(install, "yaml")
    kustomization = (MANIFESTS / "install" / "kustomization.yaml").read_text()
    # The default line of the docs is the file's, and it names what `make image` builds.
    assert default_line.splitlines()[1] in kustomization.splitlines()
    assert _images(_rendered()) == {_build_image_name()}
    # Changing that one line in a copy of manifests/ runs the registry's image everywhere.
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    edited = kustomization.replace(default_line.splitlines()[1], registry_line.rstrip("\n"))
    assert edited != kustomization
    (copy / "install" / "kustomization.yaml").write_text(edited)
    assert _images(yaml_docs(kustomize(copy))) == {REGISTRY_IMAGE}
    # The overlay of one's own, beside an untouched checkout, does the same.
    mine = tmp_path / "beside" / "my-install"
    mine.mkdir(parents=True)
    (mine.parent / "manifests").symlink_to(MANIFESTS)
    (mine / "kustomization.yaml").write_text(overlay)
    rendered = yaml_docs(kustomize(mine))
    assert _images(rendered) == {REGISTRY_IMAGE}
    assert len(rendered) == len(_rendered())
