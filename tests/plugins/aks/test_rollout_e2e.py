"""End to end: the orchestrator on the local control plane rolls a ClusterVersion over four
emulated AKS clusters through the AKS plugin, keeping requiredAvailableCount."""

from __future__ import annotations

from pathlib import Path

from plugins.aks.fleet import AksFleet
from tests.plugins.aks.support import (
    FAST,
    NEW,
    cluster_id,
    plugin_config,
    populate,
    running_plugin,
)
from tests.support.aks_emulator import AksEmulator
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import CV, OrchestratorProcess, seed_cluster_version
from tests.support.plugin_harness import (
    FloorSampler,
    orchestrator_process,
)

__all__ = ["orchestrator_process"]  # the fixture `orchestrator`

NAMES = ["c1", "c2", "c3", "c4"]
REQUIRED = 3


def _floor(emulator: AksEmulator, fleet: AksFleet) -> tuple[int, int]:
    """Clusters available (ARM provisioningState Succeeded for the cluster and each pool) and
    in service (the plugin's record), and clusters out of service."""
    service = fleet.service_states()
    serving, out = 0, 0
    for name in NAMES:
        props = emulator.cluster(cluster_id(name))["properties"]
        states = {props["provisioningState"]} | {
            p["provisioningState"] for p in props["agentPoolProfiles"]
        }
        in_service = service.get(cluster_id(name), True)
        if in_service and states == {"Succeeded"}:
            serving += 1
        if not in_service:
            out += 1
    return serving, out


def test_rollout_over_four_aks_clusters_converges_and_keeps_the_floor(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    with AksEmulator(op_seconds=FAST) as emu:
        populate(emu, NAMES)
        config = plugin_config(emu, NAMES, state_file=tmp_path / "aks-ops.jsonl")
        with (
            running_plugin(emu, config) as plugin,
            FloorSampler(lambda: _floor(emu, plugin.plugin.fleet)) as floor,
        ):
            cvs = CV(control_plane, namespace)
            cvs.create(
                seed_cluster_version(
                    "aks-fleet", plugin.address, [cluster_id(n) for n in NAMES], NEW, REQUIRED
                )
            )
            status = wait_for(
                "the AKS rollout completes",
                lambda: cvs.phase_is("aks-fleet", "Completed"),
                timeout=180,
                interval=0.2,
            )
            service = plugin.plugin.fleet.service_states()
        for name in NAMES:
            props = emu.cluster(cluster_id(name))["properties"]
            assert props["currentKubernetesVersion"] == NEW
            assert {
                p["name"]: p["currentOrchestratorVersion"] for p in props["agentPoolProfiles"]
            } == {
                "system": NEW,
                "user": NEW,
            }
            assert props["provisioningState"] == "Succeeded"
            assert service.get(cluster_id(name), True)  # back in service
        # One control-plane PUT per cluster and one PUT per pool: nothing started twice.
        assert emu.calls("ManagedClusters.CreateOrUpdate") == 4
        assert emu.calls("AgentPools.CreateOrUpdate") == 8
        # The floor: never fewer than REQUIRED clusters available and in service.
        assert floor.samples and min(floor.samples) >= REQUIRED
        assert floor.most_out == 1
        assert status["summary"]["upToDate"] == 4
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
