"""scripts/dev-control-plane: up gives a working kubeconfig, a second up reuses, down cleans up."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.controlplane import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "dev-control-plane"


def _run(dev_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        env={**os.environ, "FLEET_DEV_DIR": str(dev_dir), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _pids(dev_dir: Path) -> dict[str, int]:
    files = {
        "etcd": dev_dir / "etcd.pid",
        "kube-apiserver": dev_dir / "apiservers" / "main" / "kube-apiserver.pid",
    }
    return {name: int(path.read_text()) for name, path in files.items() if path.exists()}


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains text."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


@pytest.fixture
def dev_dir(kube_binaries: tuple[Path, Path], tmp_path: Path) -> Iterator[Path]:
    """A state directory of its own, so a developer's running .dev/ plane is left alone."""
    directory = tmp_path / "dev"
    try:
        yield directory
    finally:
        _run(directory, "down")


def test_up_reuse_down(dev_dir: Path) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed (Debian's kubernetes-client or the cloud SDK's)"

    up = _run(dev_dir, "up")
    assert up.returncode == 0, up.stderr
    kubeconfig = Path(up.stdout.strip())
    assert kubeconfig == dev_dir / "kubeconfig"
    first = _pids(dev_dir)
    assert set(first) == {"etcd", "kube-apiserver"}

    get = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "get", "ns", "-o", "name"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert get.returncode == 0, get.stderr
    assert "namespace/default" in get.stdout.split()

    again = _run(dev_dir, "up")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == str(kubeconfig)
    assert "reusing" in again.stderr
    assert _pids(dev_dir) == first

    status = _run(dev_dir, "status")
    assert status.returncode == 0, status.stdout
    assert f"pid {first['kube-apiserver']}" in status.stdout

    down = _run(dev_dir, "down")
    assert down.returncode == 0, down.stderr
    assert set(first.values()) & set(_processes_mentioning(str(dev_dir))) == set()
    assert _processes_mentioning(str(dev_dir)) == []
    assert _run(dev_dir, "status").returncode == 3
    assert _run(dev_dir, "down").stdout.strip() == "dev-control-plane: nothing running"


def test_a_failed_start_names_the_step_and_leaves_nothing_behind(
    dev_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "bin" / "kube-apiserver"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'simulated start-up failure' >&2\nexit 2\n")
    broken.chmod(0o755)

    up = _run(dev_dir, "up", FLEET_KUBE_APISERVER=str(broken))

    assert up.returncode == 1
    lines = up.stderr.strip().splitlines()
    assert len(lines) == 1, up.stderr
    assert lines[0].startswith("dev-control-plane: step start: kube-apiserver main exited")
    assert "simulated start-up failure" in lines[0]
    assert _processes_mentioning(str(dev_dir)) == []
    assert _run(dev_dir, "status").returncode == 3


def test_a_missing_binary_override_is_named(dev_dir: Path, tmp_path: Path) -> None:
    up = _run(dev_dir, "up", FLEET_KUBE_APISERVER=str(tmp_path / "nowhere"))
    assert up.returncode == 1
    assert up.stderr.strip() == (
        f"dev-control-plane: step build: FLEET_KUBE_APISERVER={tmp_path / 'nowhere'} "
        "is not an executable file"
    )
