"""The conformance kit passes against the GKE plugin driving the GKE API emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import NEG, PROJECT, cluster_id
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import kit_outcome


@pytest.mark.parametrize("mode", ["backendServices", "none"])
def test_the_gke_plugin_passes_the_conformance_kit_and_is_left_as_found(
    emulator: GkeEmulator, start_plugin: StartPlugin, tmp_path: Path, mode: str
) -> None:
    running = start_plugin(mode=mode)
    outcome = kit_outcome(running.address, tmp_path / "kit.xml")
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
