"""The conformance kit passes against the GKE plugin driving the GKE API emulator."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from plugins.sdk.conformance import run_conformance
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import NEG, PROJECT, cluster_id
from tests.support.gke_emulator import GkeEmulator


def _kit(address: str, tmp_path: Path) -> dict[str, list[str]]:
    report = tmp_path / "kit.xml"
    code = run_conformance(address, timeout=30.0, pytest_args=["-q", f"--junitxml={report}"])
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome["failed"].append(name)
        elif case.find("skipped") is not None:
            outcome["skipped"].append(name)
        else:
            outcome["passed"].append(name)
    assert code == 0, outcome["failed"]
    return outcome


@pytest.mark.parametrize("mode", ["backendServices", "none"])
def test_the_gke_plugin_passes_the_conformance_kit_and_is_left_as_found(
    emulator: GkeEmulator, start_plugin: StartPlugin, tmp_path: Path, mode: str
) -> None:
    running = start_plugin(mode=mode)
    outcome = _kit(running.address, tmp_path)
    assert (
        "test_operation_is_idempotent_reaches_a_terminal_state_and_is_watched" in outcome["passed"]
    )
    if mode == "backendServices":
        # Service-out ran as a real compute operation, so the conflict check was exercised.
        assert "test_conflicting_request_is_aborted_naming_the_operation" in outcome["passed"]
        assert emulator.calls("compute.backendServices.patch") >= 4
    for name in NAMES:
        assert emulator.capacity(PROJECT, "web", NEG.format(name)) == 1.0
        assert running.client.get_cluster(cluster_id(name)).in_service
    assert emulator.calls("UpdateMaster") == 0
    assert emulator.calls("UpdateNodePool") == 0
