"""The composed provider (orchestrator.pipeline.compose) under the real run driver and engine:
a KubeFleet-like hub (inventory, taints) and an AKS-like fleet (upgrades, preflight), each an
in-memory model fleet (orchestrator.pipeline.simulate.ModelFleet) knowing clusters by its own
ids. Assertions are on the two fleets as they end, and on the floor as it went."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import api
from orchestrator.engine.decide import Call, Preflight, Upgrade, Verdict, with_status
from orchestrator.engine.initialize import pin_upgrades
from orchestrator.engine.observations import ClusterObs, OpKind, PoolObs, Snapshot
from orchestrator.pipeline.compose import ComposedProvider, Route
from orchestrator.pipeline.crossrun import Holding, neighbours
from orchestrator.pipeline.driver import CallError, RunDriver
from orchestrator.pipeline.simulate import T0, ModelFleet

OLD, NEW = "1.29.7", "1.30.3"
SUB = "00000000-0000-0000-0000-0000000000a1"
AKS_ID = (
    "/subscriptions/{label:fleet.azure.com/subscription-id}/resourceGroups/"
    "{label:fleet.azure.com/resource-group|lower}/providers/Microsoft.ContainerService/"
    "managedClusters/{label:fleet.azure.com/cluster-name}"
)
HUB_IDENTITY = "kubefleet/hub-1"


def arm_id(name: str) -> str:
    return (
        f"/subscriptions/{SUB}/resourceGroups/fleet-rg/providers/"
        f"Microsoft.ContainerService/managedClusters/{name}"
    )


def fleet_labels(name: str) -> dict[str, str]:
    return {
        "fleet.azure.com/subscription-id": SUB,
        "fleet.azure.com/resource-group": "Fleet-RG",
        "fleet.azure.com/cluster-name": name,
        "environment": "prod",
    }


@dataclass
class Part:
    """A model fleet as a part: the reads the controller makes too, and an operation it was
    never asked for is forgotten (what GetOperation's NOT_FOUND means to GrpcProvider)."""

    fleet: ModelFleet
    refuse: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)

    @property
    def supports_preflight(self) -> bool:
        return True

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        snap = self.fleet.snapshot()
        wanted = set(cluster_ids)
        clusters = {cid: c for cid, c in snap.clusters.items() if cid in wanted}
        return Snapshot(clusters, snap.operations, frozenset(self.forgotten))

    def inventory(self) -> Mapping[str, ClusterObs]:
        return dict(self.fleet.clusters)

    def learn(self, steps: Sequence[tuple[str, str, str]]) -> None:
        self.forgotten = {rid for rid, _, _ in steps if rid not in self.fleet.by_request}

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        assert cluster_id in self.fleet.clusters, f"asked about {cluster_id}, not ours"
        if cluster_id in self.refuse:
            return Preflight(Verdict.REFUSED_NEVER, T0, "VersionNotOffered", "not offered")
        return Preflight(Verdict.ACCEPTED, T0)

    def call(self, call: Call) -> object:
        return self.fleet.call(call)


@dataclass
class World:
    hub: Part
    aks: Part
    provider: ComposedProvider


def world(members: Mapping[str, Mapping[str, str]], *, stale_hub: str = "1.28.0") -> World:
    """members: name → labels on the hub; the AKS fleet has every member that has a
    cluster-name label, by its ARM id, at OLD with two pools."""
    hub = ModelFleet(
        {
            n: ClusterObs(id=n, control_plane_version=stale_hub, labels=dict(lab))
            for n, lab in members.items()
        }
    )
    aks = ModelFleet(
        {
            arm_id(lab["fleet.azure.com/cluster-name"]): ClusterObs(
                id=arm_id(lab["fleet.azure.com/cluster-name"]),
                control_plane_version=OLD,
                node_pools=(PoolObs("system", OLD), PoolObs("user", OLD)),
            )
            for lab in members.values()
            if lab.get("fleet.azure.com/cluster-name")
        }
    )
    hub_part, aks_part = Part(hub), Part(aks)
    provider = ComposedProvider(
        "kf-aks",
        Route("inventory", "kubefleet-hub", hub_part),
        Route("traffic", "kubefleet-hub", hub_part),
        Route("upgrades", "aks-prod", aks_part, AKS_ID),
        Route("preflight", "aks-prod", aks_part, AKS_ID),
        lambda: T0 + timedelta(seconds=hub.now),
    )
    return World(hub_part, aks_part, provider)


class _Store:
    def __init__(self, upgrades: dict[str, Upgrade]) -> None:
        self.upgrades = upgrades

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        self.upgrades[upgrade.name] = with_status(self.upgrades[upgrade.name], status)


class _Passing:
    def evaluate(self, checks: object, clusters: object, stage: str) -> list[api.CheckResult]:
        return []


class _Leader:
    def held(self) -> bool:
        return True


def roll(w: World, names: Sequence[str], required: int) -> dict[str, Upgrade]:
    """The run to its end, both fleets on one clock; the ClusterUpgrades as they end."""
    spec = api.UpdateRunSpec.model_validate(
        {
            "requiredAvailableCount": required,
            "providerRef": {"name": "kf-aks"},
            "clusters": [{"id": n, "version": NEW} for n in names],
        }
    )
    pinned = pin_upgrades("r", spec, w.provider.inventory(), provider_id=HUB_IDENTITY)
    assert not isinstance(pinned, list), pinned
    store = _Store({u.name: u for u in pinned.upgrades})
    driver = RunDriver(w.provider, store, _Passing(), _Leader())
    stages: list[api.StageStatus] = []
    fleets = (w.hub.fleet, w.aks.fleet)
    for _ in range(2000):
        now = fleets[0].now
        result = driver.step(
            key="team-a/r",
            uid="uid",
            spec=spec,
            upgrades=dict(store.upgrades),
            stages=stages,
            held_by={},
            now=T0 + timedelta(seconds=now),
        )
        stages = result.decision.stages
        if result.decision.phase in api.FINISHED_PHASES:
            return store.upgrades
        if result.calls_made or result.decision.changed:
            continue
        wake = None if result.requeue_after is None else now + max(result.requeue_after, 0.001)
        upcoming = [t for t in (*(f.next_completion() for f in fleets), wake) if t is not None]
        if not upcoming:
            return store.upgrades  # settled: nothing runs and nothing is due (a Blocked cluster)
        for f in fleets:
            f.now = min(upcoming)
            f.advance_to(f.now)
    raise AssertionError("the run did not finish")


def by_cluster(upgrades: Mapping[str, Upgrade]) -> dict[str, api.ClusterUpgradeStatus]:
    return {u.cluster_id: u.status for u in upgrades.values()}


def test_members_are_tainted_on_the_hub_and_upgraded_on_aks_under_the_floor() -> None:
    names = ["member-1", "member-2", "member-3", "member-4"]
    w = world({n: fleet_labels(n.replace("member", "aks")) for n in names})
    upgrades = roll(w, names, required=3)
    assert {c: s.phase for c, s in by_cluster(upgrades).items()} == dict.fromkeys(
        names, api.UpgradePhase.UPGRADED
    )
    # AKS: every control plane and pool at NEW, nothing drained there.
    for c in w.aks.fleet.clusters.values():
        assert c.control_plane_version == NEW
        assert {p.name: p.version for p in c.node_pools} == {"system": NEW, "user": NEW}
    assert {k for _, k, _, _ in w.aks.fleet.started_steps} == {
        OpKind.CONTROL_PLANE,
        OpKind.NODE_POOL,
    }
    # The hub: taints only, every member back in service, never fewer than 3 in service.
    assert {k for _, k, _, _ in w.hub.fleet.started_steps} == {
        OpKind.SERVICE_OUT,
        OpKind.SERVICE_IN,
    }
    assert all(c.in_service for c in w.hub.fleet.clusters.values())
    assert w.hub.fleet.min_available_in_service >= 3
    # One control-plane upgrade per cluster: nothing started twice.
    assert sum(1 for _, k, _, _ in w.aks.fleet.started_steps if k is OpKind.CONTROL_PLANE) == 4


def test_versions_come_from_the_upgrades_part_not_the_hubs_cached_property() -> None:
    # KubeFleet's k8s-version property lags an upgrade by up to 15 minutes: the hub still
    # says OLD for both members, AKS already has NEW for member-1.
    w = world({n: fleet_labels(n) for n in ("member-1", "member-2")}, stale_hub=OLD)
    w.aks.fleet.clusters[arm_id("member-1")] = replace(
        w.aks.fleet.clusters[arm_id("member-1")],
        control_plane_version=NEW,
        node_pools=(PoolObs("system", NEW), PoolObs("user", NEW)),
    )
    seen = w.provider.snapshot(["member-1"]).clusters["member-1"]
    assert seen.control_plane_version == NEW  # AKS's, not the hub's OLD
    assert seen.labels["environment"] == "prod"  # the hub's labels
    upgrades = by_cluster(roll(w, ["member-1", "member-2"], required=1))
    assert upgrades["member-1"].phase == api.UpgradePhase.SKIPPED
    assert upgrades["member-2"].phase == api.UpgradePhase.UPGRADED
    # Nothing was done to member-1 on either side.
    assert all(cid != "member-1" for cid, *_ in w.hub.fleet.started_steps)
    assert all(cid != arm_id("member-1") for cid, *_ in w.aks.fleet.started_steps)


def test_a_member_without_the_label_is_blocked_naming_it_and_the_rest_go_on() -> None:
    labels = {n: fleet_labels(n.replace("member", "aks")) for n in ("member-1", "member-2")}
    bare = {k: v for k, v in fleet_labels("aks-3").items() if k != "fleet.azure.com/cluster-name"}
    w = world({**labels, "member-3": bare})
    upgrades = by_cluster(roll(w, ["member-1", "member-2", "member-3"], required=1))
    assert upgrades["member-3"].phase == api.UpgradePhase.BLOCKED
    assert "no label fleet.azure.com/cluster-name" in (upgrades["member-3"].message or "")
    assert "spec.parts.traffic" in (upgrades["member-3"].message or "") or (
        "spec.parts.upgrades" in (upgrades["member-3"].message or "")
    )
    assert upgrades["member-1"].phase == upgrades["member-2"].phase == api.UpgradePhase.UPGRADED
    # Refused before drained: member-3 was never tainted, nothing was called for it anywhere.
    assert all(cid != "member-3" for cid, *_ in w.hub.fleet.started_steps)
    assert w.hub.fleet.clusters["member-3"].in_service


def test_two_members_making_one_aks_id_are_both_refused() -> None:
    w = world({"member-1": fleet_labels("aks-1"), "member-2": fleet_labels("aks-1")})
    upgrades = by_cluster(roll(w, ["member-1", "member-2"], required=1))
    for cid in ("member-1", "member-2"):
        assert upgrades[cid].phase == api.UpgradePhase.BLOCKED
        assert "member-1, member-2 all make id" in (upgrades[cid].message or "")
    assert w.hub.fleet.started_steps == [] and w.aks.fleet.started_steps == []
    with pytest.raises(CallError, match="one id must name one cluster"):
        w.provider.call(
            Call(OpKind.CONTROL_PLANE, "member-1", "uid:member-1:controlPlane:x:0", "u", NEW)
        )


def test_the_preflight_parts_refusal_blocks_with_its_reason_before_any_taint() -> None:
    w = world({"member-1": fleet_labels("aks-1"), "member-2": fleet_labels("aks-2")})
    w.aks.refuse.add(arm_id("aks-2"))
    upgrades = by_cluster(roll(w, ["member-1", "member-2"], required=1))
    assert upgrades["member-2"].phase == api.UpgradePhase.BLOCKED
    assert "not offered" in (upgrades["member-2"].message or "")
    assert all(cid != "member-2" for cid, *_ in w.hub.fleet.started_steps)
    assert upgrades["member-1"].phase == api.UpgradePhase.UPGRADED


def test_catching_up_asks_each_part_only_for_the_operations_it_made() -> None:
    w = world({"member-1": fleet_labels("aks-1")})
    out = w.provider.call(
        Call(OpKind.SERVICE_OUT, "member-1", "uid:member-1:serviceOut:1.30.3:0", "u")
    )
    cp = w.provider.call(
        Call(OpKind.CONTROL_PLANE, "member-1", "uid:member-1:controlPlane:1.30.3:0", "u", NEW)
    )
    # Operations come back under the run's id of the cluster, whichever part made them.
    assert out.cluster_id == cp.cluster_id == "member-1"
    assert w.aks.fleet.ops[cp.id].cluster_id == arm_id("aks-1")
    w.provider.learn(
        [
            ("uid:member-1:serviceOut:1.30.3:0", out.id, "member-1"),
            ("uid:member-1:controlPlane:1.30.3:0", cp.id, "member-1"),
        ]
    )
    snap = w.provider.snapshot(["member-1"])
    # Asking the hub about AKS's operation (or AKS about the taint) would call it forgotten,
    # and the engine fails a forgotten step: neither is.
    assert snap.forgotten == frozenset()
    assert snap.operations["uid:member-1:controlPlane:1.30.3:0"].cluster_id == "member-1"
    w.provider.learn([("uid:member-1:nodePool/user:1.30.3:0", "op-x", "member-1")])
    assert w.provider.snapshot(["member-1"]).forgotten == {"uid:member-1:nodePool/user:1.30.3:0"}


def test_a_composed_runs_clusters_meet_a_run_on_the_plain_inventory_plugin() -> None:
    # Invariants 1 and 2 where runs meet: a composed run's ClusterUpgrades carry the inventory
    # part's identity and ids (what the factory pins), so a run on the hub plugin alone sees
    # its holdings and its floor.
    w = world({n: fleet_labels(n) for n in ("member-1", "member-2")})
    spec = api.UpdateRunSpec.model_validate(
        {
            "providerRef": {"name": "kf-aks"},
            "requiredAvailableCount": 1,
            "clusters": [{"id": "member-1", "version": NEW}, {"id": "member-2", "version": NEW}],
        }
    )
    pinned = pin_upgrades("composed", spec, w.provider.inventory(), provider_id=HUB_IDENTITY)
    assert not isinstance(pinned, list)
    holdings = [
        Holding("team-a/composed", u.spec.provider_id or "", u.cluster_id, holds=True)
        for u in pinned.upgrades
    ]
    assert {h.cluster_id for h in holdings} == {"member-1", "member-2"}
    held, floors = neighbours(
        holdings, lambda run: 1, HUB_IDENTITY, "team-b/plain", {"member-1", "member-2"}
    )
    assert held == {"member-1": "team-a/composed", "member-2": "team-a/composed"}
    assert [(f.run, f.required) for f in floors] == [("team-a/composed", 1)]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.sampled_from(["ok", "no-label", "shared", "not-on-aks", "refused"]),
        min_size=2,
        max_size=6,
    ),
    st.integers(min_value=1, max_value=5),
)
def test_any_mix_of_members_keeps_the_floor_and_touches_only_what_it_can_name(
    kinds: list[str], required: int
) -> None:
    # Each member: named on AKS and accepted, without the label, sharing its AKS name with
    # another member, named but not listed by AKS, or refused by AKS's preflight.
    required = min(required, len(kinds) - 1)
    members: dict[str, dict[str, str]] = {}
    for i, kind in enumerate(kinds):
        labels = fleet_labels("shared" if kind == "shared" else f"aks-{i}")
        if kind == "no-label":
            del labels["fleet.azure.com/cluster-name"]
        members[f"member-{i}"] = labels
    w = world(members)
    for i, kind in enumerate(kinds):
        if kind == "not-on-aks":
            del w.aks.fleet.clusters[arm_id(f"aks-{i}")]
        if kind == "refused":
            w.aks.refuse.add(arm_id(f"aks-{i}"))
    shared = kinds.count("shared") > 1
    upgrades = by_cluster(roll(w, list(members), required=required))
    for i, kind in enumerate(kinds):
        cid = f"member-{i}"
        nameable = kind == "ok" or (kind == "shared" and not shared)
        if nameable:
            assert upgrades[cid].phase == api.UpgradePhase.UPGRADED, (cid, upgrades[cid])
            aks = w.aks.fleet.clusters[arm_id("shared" if kind == "shared" else f"aks-{i}")]
            assert aks.control_plane_version == NEW
        else:
            assert upgrades[cid].phase == api.UpgradePhase.BLOCKED, (cid, upgrades[cid])
            assert all(c != cid for c, *_ in w.hub.fleet.started_steps)
    # Never fewer than the floor in service on the hub, nothing left out; each AKS cluster
    # upgraded at most once.
    assert w.hub.fleet.min_available_in_service >= required
    assert all(c.in_service for c in w.hub.fleet.clusters.values())
    upgraded = [c for c, k, _, _ in w.aks.fleet.started_steps if k is OpKind.CONTROL_PLANE]
    assert len(upgraded) == len(set(upgraded))
