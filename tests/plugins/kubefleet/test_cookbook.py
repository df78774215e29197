"""The KubeFleet cookbook's own example YAMLs, unchanged, approved end to end in each generation.

The examples come from ../shared/upstream/cookbook-examples (main_*: the current cookbook,
autoapprove.kubernetes-fleet.io; pr_*: the seed tutorial's, metric.kubernetes-fleet.io) and are
applied with kubectl as a cookbook user would. Their members are kind-cluster-1..3; here each
is backed by one of the test's member apiservers, its own sample app scraped by a real
Prometheus, and a real fleet-metric-collector process (our agent, in place of the cookbook's
metric-collector). The plugin and the real orchestrator replace the cookbook's
approval-request-controller. Nothing of the user's YAML changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from plugins.kubefleet import collector_names
from plugins.kubefleet.gates import GateRef
from plugins.kubefleet.objects import APPROVAL_REQUESTS, CLUSTER_APPROVAL_REQUESTS
from tests.plugins.kubefleet.conftest import (
    KF,
    MEMBERS,
    AgentProcess,
    Fleet,
    RunningPlugin,
    StartPlugin,
    _bind_agent,
    agent_args,
    service_account_token,
)
from tests.plugins.kubefleet.support import (
    approval,
    approved,
    conditions,
    hub_report,
    member_object,
    run_succeeded,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl
from tests.support.kubefleet_emulator import KubeFleetEmulator
from tests.support.orchestrator import OrchestratorProcess
from tests.support.upstream import upstream_file

STEP = 90.0  # seconds any one step may take on a loaded machine
EXAMPLE_MEMBERS = {  # main_fleet_v1beta1_membercluster.yaml → the test member backing it
    "kind-cluster-1": ("member-1", "staging"),
    "kind-cluster-2": ("member-2", "prod"),
    "kind-cluster-3": ("member-3", "prod"),
}
CLUSTER_RUN, STAGED_RUN, NS = "example-cluster-staged-run", "example-staged-run", "test-ns"


def example(name: str) -> Path:
    return upstream_file(f"cookbook-examples/{name}")


def apply_example(hub: KubeCluster, name: str) -> str:
    """kubectl apply -f the example, unchanged."""
    return kubectl(hub, "apply", "-f", str(example(name)))


@pytest.fixture
def cookbook_members(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    tmp_path: Path,
) -> Iterator[dict[str, AgentProcess]]:
    """The example's MemberClusters (applied unchanged, then joined by the emulator) in place
    of member-1..3, each with an agent of its own name; member-1..3 come back afterwards."""
    for name in MEMBERS:
        emulator.leave(name)
    apply_example(hub, "main_fleet_v1beta1_membercluster.yaml")
    agents: dict[str, AgentProcess] = {}
    token = tmp_path / "agent.token"
    token.write_text(service_account_token(hub, "fleet-system", "fleet-metric-collector"))
    for name, (member, environment) in EXAMPLE_MEMBERS.items():
        emulator.join(name, {"environment": environment}, "1.29.4", member_clusters[member])
        _bind_agent(hub, name)
        args = agent_args(name, member_clusters[member], hub, token, fleet.prometheus[member])
        agents[name] = AgentProcess(name, args, tmp_path / f"{name}-agent.log").start()
        fleet.apps[member].set([1.0, 1.0])  # the trackers ask for 2 healthy replicas
    if "namespace/" + NS not in kubectl(hub, "get", "namespaces", "-o", "name"):
        kubectl(hub, "create", "namespace", NS)
    try:
        yield agents
    finally:
        for agent in agents.values():
            agent.stop()
        emulator.stop_loop()
        emulator.clear()
        for name in EXAMPLE_MEMBERS:
            emulator.leave(name)


def _both_runs_approved(emulator: KubeFleetEmulator) -> bool:
    return run_succeeded(emulator, CLUSTER_RUN) and run_succeeded(emulator, STAGED_RUN, NS)


def _apply_runs(hub: KubeCluster, *names: str) -> None:
    for name in names:
        apply_example(hub, name)


def test_the_current_cookbooks_examples_are_approved_end_to_end_unchanged(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    cookbook_members: dict[str, AgentProcess],
    start_plugin: StartPlugin,
    plugin_kubeconfig: Path,
    orchestrator: Callable[[RunningPlugin], OrchestratorProcess],
) -> None:
    plugin = start_plugin(plugin_kubeconfig, cookbook="auto")  # auto: the hub serves both
    assert plugin.plugin.hub.cookbook.name == "current"
    orchestrator(plugin)
    _apply_runs(
        hub,
        "main_clusterstagedworkloadtracker.yaml",
        "main_stagedworkloadtracker.yaml",
        "main_sample-metric-app.yaml",
        "main_example-crp.yaml",
        "main_example-csus.yaml",
        "main_example-rp.yaml",
        "main_example-sus.yaml",
        "main_example-csur.yaml",
        "main_example-sur.yaml",
    )
    # The hub side creates the cookbook's report in each staging cluster's namespace, and our
    # agent fills it as the cookbook's collector would.
    mc = collector_names(
        GateRef(
            CLUSTER_APPROVAL_REQUESTS, "", f"{CLUSTER_RUN}-after-staging", CLUSTER_RUN, "staging"
        )
    )[0]
    assert mc == "mc-example-cluster-staged-run-staging"
    report = wait_for(
        "the staging report filled by the agent",
        lambda: (
            (r := hub_report(hub, "kind-cluster-1", mc))
            and (r.get("status") or {}).get("collectedMetrics")
            and r
        ),
        STEP,
    )
    metric = report["status"]["collectedMetrics"][0]
    assert set(metric) == {"namespace", "workloadName", "workloadKind", "podName", "health"}
    assert report["status"]["workloadsMonitored"] == 1
    wait_for("both runs approved stage by stage", lambda: _both_runs_approved(emulator), 3 * STEP)
    for run, namespace in ((CLUSTER_RUN, ""), (STAGED_RUN, NS)):
        for stage in ("staging", "prod"):
            request = approval(emulator, run, stage, namespace)
            assert approved(request), (run, stage)
            cond = conditions(request)["Approved"]
            assert cond["reason"] == "ApprovedByFleetOrchestrator"
            assert cond["observedGeneration"] == request["metadata"]["generation"]
    # Every report of the runs is gone once their gates are resolved.
    staged_mc = collector_names(
        GateRef(APPROVAL_REQUESTS, NS, f"{STAGED_RUN}-after-prod", STAGED_RUN, "prod")
    )[0]
    for name in ("kind-cluster-2", "kind-cluster-3"):
        wait_for(
            f"the prod report on {name} removed",
            lambda name=name: hub_report(hub, name, staged_mc) is None,
            STEP,
        )


def test_the_seed_tutorials_examples_are_approved_end_to_end_unchanged(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    cookbook_members: dict[str, AgentProcess],
    start_plugin: StartPlugin,
    plugin_kubeconfig: Path,
    orchestrator: Callable[[RunningPlugin], OrchestratorProcess],
) -> None:
    plugin = start_plugin(plugin_kubeconfig, cookbook="seed")
    orchestrator(plugin)
    # The seed-era run says state: Started, which KubeFleet's own CRD (e160c1c, enum
    # Initialize/Run/Stop) refuses: a KubeFleet version difference, not ours. Every other
    # example applies unchanged; the run is the current example (state: Run).
    with pytest.raises(AssertionError) as refused:
        apply_example(hub, "pr_example-csur.yaml")
    assert 'Unsupported value: "Started"' in str(refused.value)
    _apply_runs(
        hub,
        "pr_clusterstagedworkloadtracker.yaml",
        "pr_stagedworkloadtracker.yaml",
        "main_sample-metric-app.yaml",
        "main_example-crp.yaml",
        "main_example-csus.yaml",
        "main_example-csur.yaml",
    )
    mc = collector_names(
        GateRef(
            CLUSTER_APPROVAL_REQUESTS, "", f"{CLUSTER_RUN}-after-staging", CLUSTER_RUN, "staging"
        )
    )[0]
    placed = wait_for(
        "the MetricCollector placed on kind-cluster-1's apiserver",
        lambda: member_object(member_clusters["member-1"], "metriccollectors", mc),
        STEP,
    )
    assert placed["spec"]["reportNamespace"] == "fleet-member-kind-cluster-1"
    wait_for(
        "the run approved stage by stage", lambda: run_succeeded(emulator, CLUSTER_RUN), 3 * STEP
    )
    for stage in ("staging", "prod"):
        assert approved(approval(emulator, CLUSTER_RUN, stage)), stage
    assert emulator.violations == []


@pytest.mark.parametrize(
    "name",
    [
        "memberclusters.yaml",
        "sample-metric-app.yaml",
        "cluster-staged-update.yaml",
        "staged-update.yaml",
    ],
)
def test_our_examples_are_accepted_by_the_real_crds(hub: KubeCluster, name: str) -> None:
    """manifests/kubefleet/examples against KubeFleet's and the cookbook's CRDs (server dry
    run: validated and pruned as if created, nothing stored)."""
    if "namespace/" + NS not in kubectl(hub, "get", "namespaces", "-o", "name"):
        kubectl(hub, "create", "namespace", NS)
    path = KF / "examples" / name
    stored = json.loads(kubectl(hub, "apply", "--dry-run=server", "-f", str(path), "-o", "json"))
    written = [d for d in yaml.safe_load_all(path.read_text()) if d]
    items = stored["items"] if stored.get("kind") == "List" else [stored]
    assert len(items) == len(written)
    for sent, kept in zip(written, items, strict=True):
        # Nothing of what the example says is pruned (e.g. a tracker's extra checks, kept
        # in an annotation because the cookbook's schema has no field for them).
        for key in set(sent) - {"metadata", "status"}:
            assert kept.get(key) == sent[key] or _covers(kept.get(key), sent[key]), (name, key)
        for key in ("labels", "annotations"):
            wanted = (sent.get("metadata") or {}).get(key) or {}
            assert _covers(kept["metadata"].get(key) or {}, wanted), (name, key)


def _covers(kept: object, sent: object) -> bool:
    """kept carries everything of sent (the server may add defaults)."""
    if isinstance(sent, dict):
        return isinstance(kept, dict) and all(_covers(kept.get(k), v) for k, v in sent.items())
    if isinstance(sent, list):
        return (
            isinstance(kept, list)
            and len(kept) == len(sent)
            and all(_covers(k, v) for k, v in zip(kept, sent, strict=True))
        )
    return kept == sent or (sent == "" and kept is None)  # the 1.20 server's "" -> null
