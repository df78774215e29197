"""End to end, issue 22 item 3: a provider composed of KubeFleet (inventory, taints, stage
approvals) and AKS (upgrades, preflight), on the real stack.

The hub and members of the KubeFleet tests (upstream CRDs, the emulator, real Prometheus and
collector agents), the AKS emulator behind the real AKS plugin (Microsoft's clients unchanged),
both plugins on loopback, and `fleet-orchestrator run --plugin kubefleet=...` as a subprocess.
The platform admin declares the two plugins as FleetProviders that allow nobody, and a composed
FleetProvider over them that allows the test's namespace; a ClusterVersion names the composed
one. Its members carry the labels Azure Kubernetes Fleet Manager puts on every MemberCluster
(fleet.azure.com/subscription-id, /resource-group, /cluster-name), from which the composition
makes each member's AKS resource id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator import api
from tests.plugins.aks.support import GROUP, NEW, SUBSCRIPTION, cluster_id, plugin_config
from tests.plugins.aks.support import populate as populate_aks
from tests.plugins.aks.support import running_plugin as running_aks_plugin
from tests.plugins.kubefleet.conftest import MEMBERS, Fleet, RunningPlugin, StartPlugin
from tests.plugins.kubefleet.support import (
    approval,
    approved,
    create_tracker,
    run_succeeded,
    start_cluster_run,
)
from tests.support.aks_emulator import AksEmulator
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubefleet_emulator import KubeFleetEmulator
from tests.support.orchestrator import CV, OrchestratorProcess
from tests.support.plugin_harness import FloorSampler, composed_fleet_provider

NAMES = list(MEMBERS)
REQUIRED = 2
AKS_ID = (
    "/subscriptions/{label:fleet.azure.com/subscription-id}/resourceGroups/"
    "{label:fleet.azure.com/resource-group}/providers/Microsoft.ContainerService/"
    "managedClusters/{label:fleet.azure.com/cluster-name}"
)


def taint_sampler(emulator: KubeFleetEmulator) -> FloorSampler:
    """Samples the hub while in its `with` block: the members tainted (out of service) and the
    others, each time; `most_out` is the most tainted at once."""

    def sample() -> tuple[int, int]:
        members = emulator.members()
        out = sum(1 for m in members.values() if (m.get("spec") or {}).get("taints"))
        return len(members) - out, out

    return FloorSampler(sample)


def test_kubefleet_taints_and_approves_while_aks_upgrades_the_members(
    control_plane: KubeCluster,
    namespace: str,
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    start_plugin: StartPlugin,
    plugin_kubeconfig: Path,
    orchestrator: Callable[[RunningPlugin], OrchestratorProcess],
    names: Callable[[str], str],
) -> None:
    fleet.healthy()
    for name, labels in MEMBERS.items():
        emulator.join(
            name,
            {
                **labels,
                "fleet.azure.com/subscription-id": SUBSCRIPTION,
                "fleet.azure.com/resource-group": GROUP,
                "fleet.azure.com/cluster-name": name,
                "fleet.azure.com/location": "westeurope",
            },
        )
    staged = names("csur")
    create_tracker(hub, staged)
    with AksEmulator(op_seconds=0.3) as arm:
        populate_aks(arm, NAMES)
        config = plugin_config(arm, NAMES, traffic="unsupported")  # no traffic of its own
        with running_aks_plugin(arm, config) as aks:
            kubefleet = start_plugin(plugin_kubeconfig)
            hub_identity = kubefleet.client.info()
            with composed_fleet_provider(
                control_plane,
                namespace,
                ("kubefleet", kubefleet.address),
                ("aks", aks.address),
                AKS_ID,
            ) as provider:
                proc = orchestrator(kubefleet)
                start_cluster_run(emulator, staged, "staging", "prod")
                cvs = CV(control_plane, namespace)
                with taint_sampler(emulator) as taints:
                    cvs.create(
                        {
                            "apiVersion": api.API_VERSION,
                            "kind": api.KIND,
                            "metadata": {"name": "members"},
                            "spec": {
                                "requiredAvailableCount": REQUIRED,
                                "providerRef": {"name": provider},
                                "clusters": [{"id": n, "version": NEW} for n in NAMES],
                            },
                        }
                    )
                    status = wait_for(
                        "the composed rollout completes",
                        lambda: cvs.phase_is("members", "Completed", "Failed", "Invalid"),
                        timeout=240,
                        interval=0.3,
                    )
                assert status["phase"] == "Completed", (status, proc.log.read_text()[-3000:])
                upgrades = cvs.upgrades("members")
                # The KubeFleet staged run's stages approved by the same orchestrator.
                wait_for(
                    "the staged run's stages approved",
                    lambda: approved(approval(emulator, staged, "prod")),
                    timeout=120,
                )
                assert approved(approval(emulator, staged, "staging"))
                wait_for("the staged run succeeds", lambda: run_succeeded(emulator, staged), 60)
                log = proc.log.read_text(errors="replace")

    # AKS: every member's control plane and both pools at NEW, each upgraded once.
    for name in NAMES:
        props = arm.cluster(cluster_id(name))["properties"]
        assert props["currentKubernetesVersion"] == NEW
        assert {p["name"]: p["currentOrchestratorVersion"] for p in props["agentPoolProfiles"]} == {
            "system": NEW,
            "user": NEW,
        }
    assert arm.calls("ManagedClusters.CreateOrUpdate") == len(NAMES)
    assert arm.calls("AgentPools.CreateOrUpdate") == 2 * len(NAMES)
    # KubeFleet: each member was tainted in turn (never more than the floor allows) and every
    # taint is gone.
    assert taints.samples and taints.most_out == len(NAMES) - REQUIRED
    assert all(not (m.get("spec") or {}).get("taints") for m in emulator.members().values())
    # The clusters carry the inventory part's identity and ids (runs on the KubeFleet plugin
    # alone meet them: docs/plugin-contract.md "Composed providers").
    assert set(upgrades) == set(NAMES)
    assert {u["spec"]["providerId"] for u in upgrades.values()} == {
        f"{hub_identity.name}/{hub_identity.fleet_id}"
    }
    assert all(u["status"]["phase"] == "Upgraded" for u in upgrades.values())
    assert "Traceback" not in log
