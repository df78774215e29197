"""The container image, built once per test run with `scripts/build-image` (buildah, podman).

Skipped only where the container tools cannot run on this machine, and never under CI=true,
where a missing tool or a failed build fails the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """podman with the project's containers.conf (runc, cgroupfs, no ulimits)."""
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / ".build" / "containers.conf")}
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.fixture(scope="session")
def image() -> str:
    """The image name, built for this run (the mmdebstrap base is cached across runs)."""
    missing = [t for t in ("podman", "buildah", "runc", "mmdebstrap") if not shutil.which(t)]
    if missing:
        reason = f"{', '.join(missing)} missing: apt-get install buildah podman runc mmdebstrap"
        if _in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-image")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/build-image failed:\n{done.stderr[-3000:]}", pytrace=False)
    lines = done.stdout.strip().splitlines()
    print(f"\nimage {lines[0]}: {lines[-1]}")
    return lines[0]
