"""The example ClusterVersions: accepted by the apiserver, valid, and they plan to completion."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.controlplane import REPO_ROOT
from orchestrator import api
from orchestrator.engine.validate import parse_spec, validate_spec
from plugins.sim.server import SimOptions, Simulator
from tests.support.kube import KubeCluster
from tests.support.kubectl import kubectl, yaml_docs

EXAMPLES = REPO_ROOT / "manifests" / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
DEMO_FLEET = REPO_ROOT / "scripts" / "demo-fleet.yaml"
DEPLOYMENT = REPO_ROOT / "manifests" / "install" / "deployment.yaml"


def _cluster_versions(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml_docs([path]) if d.get("kind") == api.KIND]


def test_there_are_examples_of_every_kind() -> None:
    assert {p.stem for p in EXAMPLE_FILES} >= {"original", "staged", "demo", "tls"}


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_apiserver(
    control_plane: KubeCluster, namespace: str, path: Path
) -> None:
    out = kubectl(control_plane, "apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == len(yaml_docs([path])), lines
    assert all(line.endswith("created (server dry run)") for line in lines), lines


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_parses_and_validates(path: Path) -> None:
    docs = _cluster_versions(path)
    assert docs, f"{path.name} holds no ClusterVersion"
    for doc in docs:
        assert doc["apiVersion"] == api.API_VERSION
        spec = parse_spec(doc["spec"])
        assert isinstance(spec, api.ClusterVersionSpec), spec
        assert validate_spec(spec) == []


def test_original_example_uses_only_the_original_operators_fields() -> None:
    (doc,) = _cluster_versions(EXAMPLES / "original.yaml")
    spec = doc["spec"]
    assert set(spec) == {"requiredAvailableCount", "opsEndpoint", "clusters"}
    assert set(spec["opsEndpoint"]) == {"endpoint", "insecure"}
    assert len(spec["clusters"]) == 3
    for cluster in spec["clusters"]:
        assert set(cluster) == {"id", "version"}
        assert cluster["id"].startswith("projects/") and "/clusters/" in cluster["id"]


@pytest.fixture
def demo_sim() -> Iterator[Simulator]:
    sim = Simulator(SimOptions(fleet_file=str(DEMO_FLEET), reload_interval=0))
    yield sim
    sim.stop()


@pytest.fixture
def install_sim() -> Iterator[Simulator]:
    """The fleet of the install's default plugin sidecar, from the Deployment's own args."""
    (deployment,) = yaml_docs([DEPLOYMENT])
    sidecar = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "plugin-sim"
    )
    args = sidecar["args"]
    sim = Simulator(SimOptions(generate=int(args[args.index("--generate") + 1]), reload_interval=0))
    yield sim
    sim.stop()


def _plan(path: Path, endpoint: str, *extra: str) -> str:
    """`fleet-orchestrator plan` of an example against a running plugin."""
    cli = [sys.executable, "-m", "orchestrator.cli", "plan"]
    done = subprocess.run(
        [*cli, "-f", str(path), "--endpoint", endpoint, *extra],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_demo_example_matches_the_demo_fleet(demo_sim: Simulator) -> None:
    (doc,) = _cluster_versions(EXAMPLES / "demo.yaml")
    fleet_ids = {c["id"] for c in yaml_docs([DEMO_FLEET])[0]["clusters"]}
    assert {c["id"] for c in doc["spec"]["clusters"]} == fleet_ids
    assert len(fleet_ids) == 12 and doc["spec"]["requiredAvailableCount"] == 8
    out = _plan(EXAMPLES / "demo.yaml", demo_sim.address, "--step-seconds", "2")
    assert "stage canary: 2 cluster(s)" in out
    assert "stage early: 4 cluster(s)" in out
    assert "stage main: 6 cluster(s)" in out
    assert "lowest available in service: 8" in out
    assert "(Succeeded)" in out  # the run's phase (the ClusterVersion would say Completed)


def test_staged_example_runs_on_the_default_install_and_waits_for_approval(
    install_sim: Simulator,
) -> None:
    path = EXAMPLES / "staged.yaml"
    waiting = _plan(path, install_sim.address)
    assert "stage main awaits approval" in waiting
    assert f"{api.ANNOTATION_APPROVE_STAGES} annotation" in waiting
    approved = _plan(path, install_sim.address, "--approve-all")
    assert "(Succeeded)" in approved
    assert "lowest available in service: 9" in approved
