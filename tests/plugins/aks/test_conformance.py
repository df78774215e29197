"""The conformance kit passes against the AKS plugin driving the AKS emulator, durability
included (the kit restarts the plugin on the same endpoint), and leaves the fleet as found."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from plugins.aks import AksPlugin, AksPluginOptions, parse_config
from tests.plugins.aks.conftest import NAMES
from tests.plugins.aks.support import OLD, cluster_id, plugin_config
from tests.support.aks_emulator import AksEmulator
from tests.support.plugin_harness import kit_outcome


@pytest.mark.parametrize("traffic", ["recordOnly", "unsupported"])
def test_the_aks_plugin_passes_the_conformance_kit_and_is_left_as_found(
    emulator: AksEmulator, tmp_path: Path, traffic: str
) -> None:
    config = parse_config(
        plugin_config(emulator, NAMES, traffic=traffic, state_file=tmp_path / "ops.jsonl")
    )

    def start(listen: str = "127.0.0.1:0") -> AksPlugin:
        return AksPlugin(
            AksPluginOptions(
                config=config,
                listen=listen,
                registry=CollectorRegistry(),
                credential=emulator.credential(),
            )
        )

    plugins = [start()]
    address = plugins[0].address

    def restart() -> None:
        plugins[-1].stop(grace=0)
        plugins.append(start(address))

    try:
        outcome = kit_outcome(address, tmp_path / "kit.xml", restart=restart)
    finally:
        plugins[-1].stop(grace=0)
    assert (
        "test_operation_is_idempotent_reaches_a_terminal_state_and_is_watched" in outcome["passed"]
    )
    assert len(plugins) > 1  # the durability checks restarted it
    for name in NAMES:
        cluster = emulator.cluster(cluster_id(name))["properties"]
        assert cluster["currentKubernetesVersion"] == OLD
        assert cluster["provisioningState"] == "Succeeded"
    assert emulator.calls("ManagedClusters.CreateOrUpdate") == 0
    assert emulator.calls("AgentPools.CreateOrUpdate") == 0
