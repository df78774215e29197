"""End to end: the orchestrator on the local control plane (real kube-apiserver) rolls a
ClusterVersion over four emulated EKS clusters through the EKS plugin over gRPC, draining each
through Route 53 weighted records, keeping requiredAvailableCount: never fewer than three
clusters with traffic (weight above 0) and no EKS update in progress."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator import api
from tests.plugins.eks.support import (
    NEW,
    POOLS,
    RECORD,
    REGION,
    ZONE,
    cluster_id,
    plugin_config,
    populate,
    route53_traffic,
    running_plugin,
)
from tests.support.eks_emulator import EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import CV, OrchestratorProcess, seed_cluster_version
from tests.support.plugin_harness import (
    FloorSampler,
    orchestrator_process,
)

__all__ = ["orchestrator_process"]  # the fixture `orchestrator`

NAMES = ["c1", "c2", "c3", "c4"]
REQUIRED = 3
OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
CP = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
NP = cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL


class TrafficSampler(FloorSampler):
    """How many clusters serve (Route 53 weight above 0) with no EKS update in progress
    (control plane or node group), and how many are drained (weight 0); every cluster seen
    drained."""

    def __init__(self, emulator: EksEmulator, route53: Route53Emulator) -> None:
        super().__init__()
        self._emulator = emulator
        self._route53 = route53
        self.drained: set[str] = set()  # clusters seen at weight 0

    def sample(self) -> tuple[int, int]:
        serving = out = 0
        for name in NAMES:
            updates = self._emulator.cluster(REGION, name)["updates"]
            idle = all(status != "InProgress" for _, _, status in updates)
            weight = self._route53.weight(ZONE, RECORD, name) or 0
            serving += idle and weight > 0
            out += weight == 0
            if weight == 0:
                self.drained.add(name)
        return serving, out


def _cluster_version(endpoint: str) -> dict[str, Any]:
    return seed_cluster_version(
        "eks-fleet", endpoint, [cluster_id(n) for n in NAMES], NEW, REQUIRED
    )


def _most_out_at_once(ops: list[cluster_pb2.Operation]) -> int:
    """The most clusters out of service at one instant, from the service operations' times."""
    events = []
    for op in ops:
        if op.kind in (OUT, IN) and op.state == cluster_pb2.OPERATION_STATE_SUCCEEDED:
            events.append((op.end_time.ToNanoseconds(), 1 if op.kind == OUT else -1))
    out = most = 0
    for _, delta in sorted(events):
        out += delta
        most = max(most, out)
    return most


def test_rollout_over_four_eks_clusters_converges_and_keeps_the_floor(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    with EksEmulator(update_seconds=0.3) as emu, Route53Emulator(sync_seconds=0.2) as route53:
        populate(emu, NAMES)
        config = plugin_config(
            emu,
            state_file=tmp_path / "eks-ops.jsonl",
            traffic=route53_traffic(route53, NAMES, ttl=0, drainSeconds=0.2),
        )
        with running_plugin(config) as plugin, TrafficSampler(emu, route53) as sampler:
            cvs = CV(control_plane, namespace)
            cvs.create(_cluster_version(plugin.address))
            status = wait_for(
                "the EKS rollout completes",
                lambda: cvs.phase_is("eks-fleet", "Completed"),
                timeout=180,
                interval=0.2,
            )
            ops = plugin.plugin.fleet.store.operations()
            in_service = {c.id: c.in_service for c in plugin.client.list_clusters()}
        for name in NAMES:
            cluster = emu.cluster(REGION, name)
            assert cluster["version"] == NEW and cluster["status"] == "ACTIVE"
            assert cluster["nodegroups"] == dict.fromkeys(POOLS, NEW)
            # One update per control plane and per node group: nothing started twice.
            assert sorted(cluster["updates"]) == sorted(
                [("", NEW, "Successful")] + [(p, NEW, "Successful") for p in POOLS]
            )
            kinds = [op.kind for op in ops if op.cluster_id == cluster_id(name)]
            assert kinds[0] == OUT and kinds[-1] == IN and kinds[1] == CP
            assert sorted(kinds[2:-1]) == [NP, NP]
            assert in_service[cluster_id(name)]
            assert route53.weight(ZONE, RECORD, name) == 100
        assert emu.calls("UpdateClusterVersion") == 4
        # Each cluster drained and restored once: two Route 53 changes per cluster.
        assert route53.calls("ChangeResourceRecordSets") == 2 * len(NAMES)
        # The floor: never fewer than REQUIRED clusters serving and not under an update.
        assert sampler.samples and min(sampler.samples) >= REQUIRED
        assert sampler.most_out == 4 - REQUIRED
        assert _most_out_at_once(ops) == 4 - REQUIRED
        assert status["summary"]["upToDate"] == 4
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"


def _cluster_upgrade(control_plane: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    objects = k8s.CustomObjectsApi(control_plane.api_client())
    listed = objects.list_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.CLUSTER_UPGRADE_PLURAL
    )
    found = [i for i in listed["items"] if i["spec"]["clusterId"] == cluster_id(name)]
    return dict(found[0]) if found else {}


def test_an_upgrade_insight_refuses_its_cluster_before_it_is_drained(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    """c3 has an ERROR upgrade insight for the target: the orchestrator's preflight gets
    REFUSED_LATER with the insight's reason, so c3 is never drained nor updated while the
    three others upgrade. (Once EKS clears the insight the verdict turns ACCEPTED:
    test_preflight; the orchestrator asks again when its verdict ages, PREFLIGHT_TTL.)"""
    with EksEmulator(update_seconds=0.3) as emu, Route53Emulator(sync_seconds=0.2) as route53:
        populate(emu, NAMES)
        emu.add_insight(
            REGION, "c3", NEW, "ERROR", "Deprecated API usage detected", "Deprecated APIs"
        )
        config = plugin_config(
            emu,
            state_file=tmp_path / "eks-ops.jsonl",
            traffic=route53_traffic(route53, NAMES, ttl=0, drainSeconds=0.2),
        )
        with running_plugin(config) as plugin, TrafficSampler(emu, route53) as sampler:
            CV(control_plane, namespace).create(_cluster_version(plugin.address))
            blocked = wait_for(
                "c3 refused for now with the insight's reason, the others upgraded",
                lambda: (
                    (cu := _cluster_upgrade(control_plane, namespace, "c3"))
                    .get("status", {})
                    .get("reason")
                    == "RefusedForNow"
                    and all(
                        emu.cluster(REGION, n)["nodegroups"] == dict.fromkeys(POOLS, NEW)
                        for n in ("c1", "c2", "c4")
                    )
                    and cu
                ),
                timeout=180,
                interval=0.2,
            )
        assert blocked["status"]["phase"] == "Blocked"
        assert "Deprecated API usage detected" in blocked["status"]["message"]
        # Refused before anything was done to it: never drained, never updated.
        assert "c3" not in sampler.drained
        assert emu.cluster(REGION, "c3")["updates"] == []
        assert emu.calls("UpdateClusterVersion") == 3  # EKS itself never had to refuse
        assert min(sampler.samples) >= REQUIRED


def test_an_update_someone_else_runs_counts_against_the_floor_and_is_never_drained(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    orchestrator: OrchestratorProcess,
) -> None:
    """A person upgrades c2's node group "system" by hand (say in the console) as the run
    starts: the plugin reports that update as c2's current operation, so the orchestrator
    leaves c2 alone (ForeignOperation) and counts it as unavailable: with 3 of 4 required,
    nothing is drained until the update by hand ends; then the rollout completes."""
    with EksEmulator(update_seconds=0.3) as emu, Route53Emulator(sync_seconds=0.2) as route53:
        populate(emu, NAMES)
        emu.held_clusters = {"c2"}
        eks = boto3.client("eks", region_name=REGION, endpoint_url=emu.endpoint)
        by_hand = eks.update_nodegroup_version(clusterName="c2", nodegroupName="system")
        config = plugin_config(
            emu,
            state_file=tmp_path / "eks-ops.jsonl",
            traffic=route53_traffic(route53, NAMES, ttl=0, drainSeconds=0.2),
        )
        with running_plugin(config) as plugin, TrafficSampler(emu, route53) as sampler:
            cvs = CV(control_plane, namespace)
            cvs.create(_cluster_version(plugin.address))
            waiting = wait_for(
                "c2 waits for the update run by hand, the run for budget",
                lambda: (
                    (cu := _cluster_upgrade(control_plane, namespace, "c2"))
                    .get("status", {})
                    .get("reason")
                    == "ForeignOperation"
                    and "availability budget" in (cvs.status("eks-fleet").get("message") or "")
                    and cu
                ),
                timeout=120,
                interval=0.2,
            )
            assert by_hand["update"]["id"] in waiting["status"]["message"]
            time.sleep(3)  # the run keeps waiting: nothing drained, nothing updated
            assert sampler.drained == set()
            assert emu.calls("UpdateClusterVersion") == 0
            emu.held_clusters = set()
            wait_for(
                "the rollout completes after the update by hand ended",
                lambda: cvs.phase_is("eks-fleet", "Completed"),
                timeout=180,
                interval=0.2,
            )
        for name in NAMES:
            cluster = emu.cluster(REGION, name)
            assert cluster["version"] == NEW and cluster["nodegroups"] == dict.fromkeys(POOLS, NEW)
            assert route53.weight(ZONE, RECORD, name) == 100
        assert min(sampler.samples) >= REQUIRED
        assert sampler.most_out == 4 - REQUIRED
