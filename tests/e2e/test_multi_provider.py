"""Issue 22 item 4, end to end: one ClusterVersion over emulated GKE, EKS and AKS clusters (three
FleetProviders, spec.providerRefs) under one requiredAvailableCount, on the real stack: the
kube-apiserver, the `fleet-orchestrator run` process, and the GKE, EKS and AKS plugins over
gRPC, each talking to its cloud's emulator through the official client library.

The adversary of the simulation, once each: the AKS plugin goes away mid-run (its clusters count
as unavailable, the run is Degraded naming it, nothing reaches it, the floor holds over the
other two, and the run goes on when it is back), EKS refuses one cluster's target (a minor
skipped: Blocked before any drain), and one AKS control-plane upgrade fails (ARM's async
operation ends Failed).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from orchestrator import api
from plugins.aks import AksPlugin, AksPluginOptions, parse_config
from tests.e2e.conftest import Objects, Orchestrators, reconcile_errors
from tests.plugins.aks import support as aks
from tests.plugins.eks import support as eks
from tests.plugins.gke import support as gke
from tests.support.aks_emulator import AksEmulator
from tests.support.eks_emulator import EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.gke_emulator import GkeEmulator
from tests.support.kube import KubeCluster, wait_for

REQUIRED = 3
GKE_NAMES, EKS_NAMES, AKS_NAMES = ["g1", "g2"], ["e1", "e2"], ["a1", "a2"]


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's default chain, from the environment (no file of the machine is read)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFLEETUPGRADETEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-key-never-logged")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


class AksPluginSlot:
    """The AKS plugin at one address, stopped and started again there (its operations
    journaled in a state file, as a restarted sidecar keeps them)."""

    def __init__(self, emulator: AksEmulator, config: dict[str, Any]) -> None:
        self.emulator, self.config = emulator, config
        self.plugin: AksPlugin | None = None
        self.address = "127.0.0.1:0"
        self.start()

    def start(self) -> None:
        self.plugin = AksPlugin(
            AksPluginOptions(
                config=parse_config(self.config),
                listen=self.address,
                registry=CollectorRegistry(),
                credential=self.emulator.credential(),
            )
        )
        self.address = self.plugin.address

    def stop(self) -> None:
        if self.plugin is not None:
            self.plugin.stop(grace=0)
            self.plugin = None

    def service_states(self) -> dict[str, bool]:
        """recordOnly: each cluster's last service change, from the journal (LookupError while
        the plugin is down: the sampler keeps what it last read)."""
        if self.plugin is None:
            raise LookupError("the AKS plugin is down")
        return self.plugin.fleet.service_states()


class FloorSampler:
    """Every few milliseconds, over the three clouds: clusters available and in service (GKE:
    RUNNING with backend capacity; EKS: no update in progress with a Route 53 weight; AKS: ARM
    provisioning Succeeded and in service by the plugin's journal)."""

    def __init__(
        self,
        gke_emu: GkeEmulator,
        eks_emu: EksEmulator,
        route53: Route53Emulator,
        aks_emu: AksEmulator,
        aks_states: Callable[[], dict[str, bool]],
    ) -> None:
        self.gke, self.eks, self.route53, self.aks = gke_emu, eks_emu, route53, aks_emu
        self.aks_states = aks_states
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="floor-sampler", daemon=True)

    def count(self, aks_states: dict[str, bool]) -> int:
        up = 0
        for name in GKE_NAMES:
            capacity = self.gke.capacity(gke.PROJECT, "web", gke.NEG.format(name)) or 0.0
            up += capacity > 0 and self.gke.cluster(gke.cluster_id(name))["status"] == "RUNNING"
        for name in EKS_NAMES:
            updates = self.eks.cluster(eks.REGION, name)["updates"]
            idle = all(status != "InProgress" for _, _, status in updates)
            up += idle and (self.route53.weight(eks.ZONE, eks.RECORD, name) or 0) > 0
        for name in AKS_NAMES:
            props = self.aks.cluster(aks.cluster_id(name))["properties"]
            states = {props["provisioningState"]} | {
                p["provisioningState"] for p in props["agentPoolProfiles"]
            }
            up += aks_states.get(aks.cluster_id(name), True) and states == {"Succeeded"}
        return up

    def _run(self) -> None:
        aks_states: dict[str, bool] = {}
        while not self._stop.wait(0.01):
            # The AKS plugin down: its clusters stay as last recorded.
            with contextlib.suppress(LookupError):
                aks_states = self.aks_states()
            self.samples.append(self.count(aks_states))

    def __enter__(self) -> FloorSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextmanager
def fleet_providers(objects: Objects, endpoints: dict[str, str]) -> Iterator[dict[str, str]]:
    """One FleetProvider per plugin, allowing the test's namespace (deleted afterwards)."""
    names = {kind: f"{kind}-{objects.ns}"[:63] for kind in endpoints}
    for kind, endpoint in endpoints.items():
        objects.api.create_cluster_custom_object(
            api.GROUP,
            api.VERSION,
            api.FLEET_PROVIDER_PLURAL,
            {
                "apiVersion": api.API_VERSION,
                "kind": api.FLEET_PROVIDER_KIND,
                "metadata": {"name": names[kind]},
                "spec": {
                    "endpoint": endpoint,
                    "insecure": True,
                    "allowedNamespaces": {"names": [objects.ns]},
                },
            },
        )
    try:
        yield names
    finally:
        for name in names.values():
            objects.api.delete_cluster_custom_object(
                api.GROUP, api.VERSION, api.FLEET_PROVIDER_PLURAL, name
            )


def _cluster_version(providers: dict[str, str]) -> dict[str, Any]:
    clusters = [
        *({"id": gke.cluster_id(n), "version": gke.NEW} for n in GKE_NAMES),
        {"id": eks.cluster_id("e1"), "version": eks.NEW},
        # A minor skipped (1.29 → 1.31): EKS refuses it (REFUSED_NEVER, MINOR_VERSION_SKIP).
        {"id": eks.cluster_id("e2"), "version": eks.NEXT},
        *({"id": aks.cluster_id(n), "version": aks.NEW} for n in AKS_NAMES),
    ]
    label = api.LABEL_PROVIDER
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "clouds"},
        "spec": {
            "requiredAvailableCount": REQUIRED,
            "providerRefs": [{"name": providers[k]} for k in ("gke", "eks", "aks")],
            "clusters": clusters,
            "strategy": {
                "maxConcurrency": 2,
                "onFailure": "Continue",
                # Stages select by provider, as by any label.
                "stages": [
                    {
                        "name": "gcp-aws",
                        "selector": {
                            "matchExpressions": [
                                {
                                    "key": label,
                                    "operator": "In",
                                    "values": [providers["gke"], providers["eks"]],
                                }
                            ]
                        },
                    },
                    {"name": "azure", "selector": {"matchLabels": {label: providers["aks"]}}},
                ],
            },
        },
    }


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def test_one_floor_over_gke_eks_and_aks_with_a_provider_down_a_refusal_and_a_failure(
    control_plane: KubeCluster, objects: Objects, orchestrators: Orchestrators, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        gke_emu = stack.enter_context(
            GkeEmulator(
                master_seconds=gke.FAST,
                nodes_seconds=gke.FAST,
                compute_op_seconds=0.2,
                soak_scale=0.01,
            )
        )
        eks_emu = stack.enter_context(EksEmulator(update_seconds=0.3))
        route53 = stack.enter_context(Route53Emulator(sync_seconds=0.2))
        aks_emu = stack.enter_context(AksEmulator(op_seconds=aks.FAST))
        gke.populate(gke_emu, GKE_NAMES, pools=("default-pool",))
        eks.populate(eks_emu, EKS_NAMES)
        aks.populate(aks_emu, AKS_NAMES)
        # a1's control-plane upgrade fails: ARM's async operation ends Failed.
        aks_emu.fail_next(aks.cluster_id("a1"))
        gke_plugin = stack.enter_context(
            gke.running_plugin(
                gke.plugin_config(gke_emu, GKE_NAMES, state_file=tmp_path / "gke.json")
            )
        )
        eks_plugin = stack.enter_context(
            eks.running_plugin(
                eks.plugin_config(
                    eks_emu,
                    state_file=tmp_path / "eks.jsonl",
                    traffic=eks.route53_traffic(route53, EKS_NAMES, ttl=0, drainSeconds=0.2),
                )
            )
        )
        slot = AksPluginSlot(
            aks_emu,
            aks.plugin_config(
                aks_emu, AKS_NAMES, state_file=tmp_path / "aks.jsonl", traffic="recordOnly"
            ),
        )
        stack.callback(slot.stop)
        providers = stack.enter_context(
            fleet_providers(
                objects,
                {"gke": gke_plugin.address, "eks": eks_plugin.address, "aks": slot.address},
            )
        )
        sampler = stack.enter_context(
            FloorSampler(gke_emu, eks_emu, route53, aks_emu, slot.service_states)
        )
        orchestrators.start()
        objects.create_cv(_cluster_version(providers))
        run = objects.current_run("clouds")
        wait_for("the run pinned 6 clusters", lambda: len(objects.upgrades(run)) == 6, timeout=60)

        # -- the AKS plugin goes away mid-run --------------------------------------------
        slot.stop()
        degraded = wait_for(
            "the run Degraded, naming the AKS FleetProvider",
            lambda: (
                c
                if (c := _condition(objects.run(run).get("status") or {}, "Degraded")).get("reason")
                == "ProviderUnavailable"
                else None
            ),
            timeout=60,
            interval=0.2,
        )
        assert f"FleetProvider {providers['aks']}" in degraded["message"]
        assert providers["gke"] not in degraded["message"]
        # The other providers' clusters go on where the floor allows: GKE and EKS finish
        # their stage (e2 refused before any drain) while AKS is away.
        wait_for(
            "g1, g2, e1 upgraded and e2 refused while AKS is down",
            lambda: (
                {
                    cid: (u.get("status") or {}).get("phase")
                    for cid, u in objects.upgrades(run).items()
                    if "/managedClusters/" not in cid
                }
                == {
                    gke.cluster_id("g1"): "Upgraded",
                    gke.cluster_id("g2"): "Upgraded",
                    eks.cluster_id("e1"): "Upgraded",
                    eks.cluster_id("e2"): "Blocked",
                }
            ),
            timeout=180,
            interval=0.3,
        )
        # Its clusters wait for it: counted as unavailable, not taken for gone.
        waiting = wait_for(
            "the AKS clusters wait for their provider",
            lambda: (
                s
                if (s := objects.upgrade_status(run, aks.cluster_id("a2"))).get("reason")
                == "ProviderUnavailable"
                else None
            ),
            timeout=60,
            interval=0.2,
        )
        assert waiting["phase"] == "Pending"
        assert f"FleetProvider {providers['aks']} is unavailable" in waiting["message"]
        assert aks_emu.cluster(aks.cluster_id("a2"))["properties"]["kubernetesVersion"] == aks.OLD

        # -- it comes back on its address: the run goes on and ends ----------------------
        slot.start()
        status = wait_for(
            "the rollout ends",
            lambda: objects.cv_phase_is("clouds", "Completed", "Failed"),
            timeout=180,
            interval=0.3,
        )
        run_status = objects.run(run).get("status") or {}
        upgrades = objects.upgrades(run)
        errors = reconcile_errors(orchestrators.logs())
    assert errors == [], errors
    assert status["phase"] == "Failed"  # a1 failed; onFailure Continue finished the rest
    assert _condition(run_status, "Degraded")["status"] == "False"
    phases = {cid: (u.get("status") or {}) for cid, u in upgrades.items()}
    a1, e2 = phases.pop(aks.cluster_id("a1")), phases.pop(eks.cluster_id("e2"))
    assert (a1["phase"], a1["reason"]) == ("Failed", "OperationFailed")
    assert (e2["phase"], e2["reason"]) == ("Blocked", "Refused")
    assert "MINOR_VERSION_SKIP" in e2["message"]
    assert {s["phase"] for s in phases.values()} == {"Upgraded"}
    # Each ClusterUpgrade records the FleetProvider it belongs to (the PROVIDER column).
    assert {u["spec"]["providerName"] for u in upgrades.values()} == set(providers.values())
    assert {
        u["spec"]["providerName"] for cid, u in upgrades.items() if "/managedClusters/" in cid
    } == {providers["aks"]}
    # The world: upgraded where it should be; e2 never drained nor updated.
    for name in GKE_NAMES:
        assert gke_emu.cluster(gke.cluster_id(name))["currentMasterVersion"] == gke.NEW
    assert eks_emu.cluster(eks.REGION, "e1")["version"] == eks.NEW
    assert eks_emu.cluster(eks.REGION, "e2")["updates"] == []
    assert route53.weight(eks.ZONE, eks.RECORD, "e2") == 100
    assert aks_emu.cluster(aks.cluster_id("a2"))["properties"]["kubernetesVersion"] == aks.NEW
    # One floor over the three clouds, sampled throughout (AKS down included).
    assert sampler.samples and min(sampler.samples) >= REQUIRED, min(sampler.samples)
