"""End to end: the orchestrator on the local control plane rolls a ClusterVersion over four
emulated GKE clusters through the GKE plugin, keeping requiredAvailableCount."""

from __future__ import annotations

from pathlib import Path

from tests.plugins.gke.support import (
    FAST,
    NEG,
    NEW,
    PROJECT,
    cluster_id,
    plugin_config,
    populate,
    running_plugin,
)
from tests.support.gke_emulator import GkeEmulator
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import CV, OrchestratorProcess, seed_cluster_version
from tests.support.plugin_harness import (
    FloorSampler,
    orchestrator_process,
)

__all__ = ["orchestrator_process"]  # the fixture `orchestrator`

NAMES = ["c1", "c2", "c3", "c4"]
REQUIRED = 3


def _floor(emulator: GkeEmulator) -> tuple[int, int]:
    """Clusters available (GKE status RUNNING) and in service (backend capacity above 0), and
    clusters out of service (capacity 0)."""
    serving, out = 0, 0
    for name in NAMES:
        capacity = emulator.capacity(PROJECT, "web", NEG.format(name)) or 0.0
        status = emulator.cluster(cluster_id(name))["status"]
        if capacity > 0 and status == "RUNNING":
            serving += 1
        if capacity == 0:
            out += 1
    return serving, out


def test_rollout_over_four_gke_clusters_converges_and_keeps_the_floor(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    # Blue-green soaks (the workers pool: 60 s) run 100 times faster than GKE waits.
    with GkeEmulator(
        master_seconds=FAST, nodes_seconds=FAST, compute_op_seconds=0.2, soak_scale=0.01
    ) as emu:
        populate(emu, NAMES)
        config = plugin_config(emu, NAMES, state_file=tmp_path / "gke-state.json")
        with running_plugin(config) as plugin, FloorSampler(lambda: _floor(emu)) as floor:
            cvs = CV(control_plane, namespace)
            cvs.create(
                seed_cluster_version(
                    "gke-fleet", plugin.address, [cluster_id(n) for n in NAMES], NEW, REQUIRED
                )
            )
            status = wait_for(
                "the GKE rollout completes",
                lambda: cvs.phase_is("gke-fleet", "Completed"),
                timeout=180,
                interval=0.2,
            )
        for name in NAMES:
            cluster = emu.cluster(cluster_id(name))
            assert cluster["currentMasterVersion"] == NEW
            assert {p["name"]: p["version"] for p in cluster["nodePools"]} == {
                "default-pool": NEW,
                "workers": NEW,
            }
            assert cluster["status"] == "RUNNING"
            assert emu.capacity(PROJECT, "web", NEG.format(name)) == 1.0
        # One control-plane upgrade per cluster and one per pool: nothing started twice.
        assert emu.calls("UpdateMaster") == 4
        assert emu.calls("UpdateNodePool") == 8
        bodies = emu.requests("UpdateNodePool")
        assert {b["imageType"] for b in bodies} == {"COS_CONTAINERD", "UBUNTU_CONTAINERD"}
        assert all("upgradeSettings" not in b for b in bodies)
        # The floor: never fewer than REQUIRED clusters available and in service.
        assert floor.samples and min(floor.samples) >= REQUIRED
        assert floor.most_out == 1
        assert status["summary"]["upToDate"] == 4
        assert "clusters" not in status
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
