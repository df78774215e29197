"""fleet-orchestrator plan with a spec that names a FleetProvider: it asks for the endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main


def test_plan_of_a_provider_ref_spec_asks_for_the_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "providerRef": {"name": "prod-gke"},
        "requiredAvailableCount": 1,
        "clusters": [{"id": "a", "version": "1.29.4"}, {"id": "b", "version": "1.29.4"}],
    }
    path = tmp_path / "cv.yaml"
    path.write_text(yaml.safe_dump({"kind": "ClusterVersion", "spec": spec}))
    assert main(["plan", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert "spec.providerRef" in err and "--endpoint HOST:PORT" in err
