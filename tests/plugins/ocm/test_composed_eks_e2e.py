"""End to end, issue 22 item 3: a provider composed of OCM (inventory, taints) and EKS
(upgrades, preflight), on the real stack.

The OCM hub of the OCM tests (its apiserver, upstream CRDs, the emulator playing the agents, the
hub's taint webhook) behind the real OCM plugin, the EKS emulator behind the real EKS plugin
(boto3 unchanged), and `fleet-orchestrator run` as a subprocess. Each ManagedCluster's EKS ARN is
made from its name and its `region.open-cluster-management.io` ClusterClaim (which the OCM plugin
reports as the label `clusterclaim/region.open-cluster-management.io`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator import api
from tests.plugins.eks.conftest import aws_environment
from tests.plugins.eks.support import ACCOUNT, NEW, POOLS, REGION
from tests.plugins.eks.support import plugin_config as eks_config
from tests.plugins.eks.support import populate as populate_eks
from tests.plugins.eks.support import running_plugin as running_eks_plugin
from tests.plugins.ocm.conftest import OLD, StartPlugin, curator_config
from tests.support.eks_emulator import EksEmulator
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import OcmEmulator
from tests.support.orchestrator import CV, OrchestratorProcess
from tests.support.plugin_harness import (
    FloorSampler,
    composed_fleet_provider,
    orchestrator_process,
)

# boto3's default chain finds the emulator's test keys; the fixture `orchestrator`
__all__ = ["aws_environment", "orchestrator_process"]
pytestmark = pytest.mark.usefixtures("aws_environment")

REQUIRED = 4
TAINT_KEY = "fleetupgrade.io/service-out"
REGION_CLAIM = "region.open-cluster-management.io"
EKS_ARN = f"arn:aws:eks:{{label:clusterclaim/{REGION_CLAIM}}}:{ACCOUNT}:cluster/{{id}}"


def taint_sampler(emulator: OcmEmulator, ids: list[str]) -> FloorSampler:
    """Samples the hub while in its `with` block: the clusters carrying our service-out taint
    and the others, each time; `most_out` is the most tainted at once."""

    def sample() -> tuple[int, int]:
        out = sum(1 for c in ids if any(t["key"] == TAINT_KEY for t in emulator.taints_of(c)))
        return len(ids) - out, out

    return FloorSampler(sample)


def waited(cvs: CV, proc: OrchestratorProcess, what: str, check: Any, **kw: Any) -> Any:
    """wait_for; on a timeout the error says where the ClusterVersion's clusters stood."""
    try:
        return wait_for(what, check, **kw)
    except TimeoutError as err:
        stood = {
            c: {k: (u.get("status") or {}).get(k) for k in ("phase", "message")}
            for c, u in cvs.upgrades("ocm-eks").items()
        }
        tail = proc.log.read_text(errors="replace")[-4000:]
        raise TimeoutError(f"{err}\n{cvs.status('ocm-eks')}\n{stood}\n{tail}") from None


def test_ocm_taints_while_eks_upgrades_the_managed_clusters(
    control_plane: KubeCluster,
    namespace: str,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    orchestrator: OrchestratorProcess,
) -> None:
    ids = names(5)
    for name in ids[:4]:
        emulator.add_cluster(name, OLD, claims={REGION_CLAIM: REGION})
    emulator.add_cluster(ids[4], OLD)  # no region claim: its ARN cannot be made
    ocm = start_plugin(curator_config())
    with EksEmulator(update_seconds=0.3) as eks_emu:
        populate_eks(eks_emu, ids)
        with (
            running_eks_plugin(eks_config(eks_emu)) as eks,
            composed_fleet_provider(
                control_plane, namespace, ("ocm", ocm.address), ("eks", eks.address), EKS_ARN
            ) as name,
        ):
            cvs = CV(control_plane, namespace)
            with taint_sampler(emulator, ids) as taints:
                cvs.create(
                    {
                        "apiVersion": api.API_VERSION,
                        "kind": api.KIND,
                        "metadata": {"name": "ocm-eks"},
                        "spec": {
                            "requiredAvailableCount": REQUIRED,
                            "providerRef": {"name": name},
                            "clusters": [{"id": c, "version": NEW} for c in ids],
                        },
                    }
                )
                waited(
                    cvs,
                    orchestrator,
                    "four clusters upgraded and the fifth refused",
                    lambda: (
                        (u := cvs.upgrades("ocm-eks"))
                        and len(u) == 5
                        and all(
                            (u[c].get("status") or {}).get("phase") == "Upgraded" for c in ids[:4]
                        )
                        and (u[ids[4]].get("status") or {}).get("phase") == "Blocked"
                    ),
                    timeout=240,
                    interval=0.3,
                )
            upgrades = cvs.upgrades("ocm-eks")
    # EKS: four control planes and their node groups at NEW, each updated once; the fifth
    # cluster untouched.
    for c in ids[:4]:
        cluster = eks_emu.cluster(REGION, c)
        assert cluster["version"] == NEW and cluster["nodegroups"] == dict.fromkeys(POOLS, NEW)
    assert eks_emu.cluster(REGION, ids[4])["updates"] == []
    assert eks_emu.calls("UpdateClusterVersion") == 4
    # OCM: the hub's taints moved traffic; never more than one out (floor 4 of 5 counts the
    # refused one as available), none left; OCM's own upgrade path was never used.
    assert taints.samples and taints.most_out == 1
    assert all(emulator.taints_of(c) == [] for c in ids)
    assert emulator.curations_started == {}
    # The refusal names the claim's label, on its own ClusterUpgrade.
    message = upgrades[ids[4]]["status"].get("message", "")
    assert f"no label clusterclaim/{REGION_CLAIM}" in message, message
