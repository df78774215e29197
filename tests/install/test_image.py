"""The image as built: every console script runs, as a non-root user, on a read-only root."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.install.conftest import podman

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = (
    "fleet-orchestrator",
    "fleet-plugin-sim",
    "fleet-plugin-gke",
    "fleet-plugin-aks",
    "fleet-plugin-eks",
    "fleet-plugin-ocm",
    "fleet-plugin-kubefleet",
    "fleet-plugin-legacy",
    "fleet-metric-collector",
)


def _run(image: str, *args: str, entrypoint: str | None = None) -> tuple[int, str]:
    flags = ["run", "--rm", "--read-only", "--network", "none"]
    if entrypoint:
        flags += ["--entrypoint", entrypoint]
    done = podman(*flags, image, *args)
    return done.returncode, done.stdout + done.stderr


def test_version_command_and_label_agree_with_the_project(image: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    inspect = podman("image", "inspect", image)
    assert inspect.returncode == 0, inspect.stderr
    labels = json.loads(inspect.stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == project
    assert labels["org.opencontainers.image.source"]
    assert len(labels["org.opencontainers.image.revision"]) == 40
    code, out = _run(image, "version")
    assert code == 0 and out.strip() == project


def test_runs_as_non_root_on_a_read_only_root(image: str) -> None:
    code, out = _run(
        image, "-c", "id -u; id -g; touch /opt/fleet/x 2>&1 || echo read-only", entrypoint="/bin/sh"
    )
    assert code == 0, out
    uid, gid, *_rest = out.split("\n")
    assert (uid, gid) == ("65532", "65532")
    assert "read-only" in out


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_starts(image: str, script: str) -> None:
    code, out = _run(image, "--help", entrypoint=script)
    assert code == 0, out
    assert "usage:" in out
