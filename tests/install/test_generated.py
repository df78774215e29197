"""The generated stubs in fleetupgrade/ match proto/ (regenerate with `make proto`), and the CRD
in manifests/crds/ matches the models in orchestrator/api/ (`python -m orchestrator.api.crd`)."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.api.crd import crd_files

ROOT = Path(__file__).resolve().parents[2]


def _tree(base: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_stubs_are_not_stale(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        [str(ROOT / "scripts" / "gen-proto"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    fresh, committed = _tree(tmp_path / "fleetupgrade"), _tree(ROOT / "fleetupgrade")
    stale = sorted(k for k in fresh.keys() | committed.keys() if fresh.get(k) != committed.get(k))
    assert not stale, f"generated stubs are stale ({', '.join(stale)}): run `make proto`"
    assert filecmp.cmp(tmp_path / "fleetupgrade" / "py.typed", ROOT / "fleetupgrade" / "py.typed")


def test_crds_are_not_stale() -> None:
    for file_name, text in crd_files().items():
        committed = (ROOT / "manifests" / "crds" / file_name).read_text()
        assert committed == text, f"manifests/crds/{file_name} is stale: run `make crds`"
