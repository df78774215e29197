"""Where runs meet (orchestrator.pipeline.crossrun): a provider is what its plugin says it is."""

from __future__ import annotations

from typing import Any

from orchestrator import api
from orchestrator.engine.decide import Floor
from orchestrator.pipeline.crossrun import (
    endpoint_identity,
    holding_of,
    neighbours,
    provider_identity,
)

SIM = provider_identity("sim.fleetupgrade.io", "fleet-a", "localhost:9000")


def _cu(ns: str, run: str, cid: str, phase: str, provider: str, pid: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterId": cid, "provider": provider}
    if pid is not None:
        spec["providerId"] = pid
    return {
        "metadata": {
            "namespace": ns,
            "name": f"{run}-{cid}",
            "labels": {api.LABEL_RUN: run},
            "ownerReferences": [{"kind": api.UPDATE_RUN_KIND, "name": run, "uid": f"uid-{run}"}],
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def test_one_plugin_by_two_addresses_is_one_provider() -> None:
    assert provider_identity("sim.fleetupgrade.io", "fleet-a", "localhost:9000") == (
        provider_identity("sim.fleetupgrade.io", "fleet-a", "127.0.0.1:9000")
    )
    assert provider_identity("sim.fleetupgrade.io", "fleet-a", "x:1") != (
        provider_identity("sim.fleetupgrade.io", "fleet-b", "x:1")
    )
    # Two plugins that happen to use the same fleet id are not one provider.
    assert provider_identity("gke.fleetupgrade.io", "fleet-a", "x:1") != (
        provider_identity("sim.fleetupgrade.io", "fleet-a", "x:1")
    )


def test_a_plugin_reporting_no_fleet_id_is_its_endpoint_as_spelled() -> None:
    assert provider_identity("legacy", "", "Plugin:9000") == endpoint_identity("plugin:9000")
    assert endpoint_identity("dns:///plugin:9000") == endpoint_identity("plugin:9000")
    # Documented: two spellings of a plugin that reports nothing are two providers.
    assert endpoint_identity("localhost:9000") != endpoint_identity("127.0.0.1:9000")


def test_holdings_and_floors_of_another_run_on_another_address_of_the_same_plugin() -> None:
    objs = [
        _cu("team-a", "strict", "c1", "UpgradingControlPlane", "localhost:9000", SIM),
        _cu("team-a", "strict", "c2", "Upgraded", "localhost:9000", SIM),
        _cu("team-a", "strict", "c3", "Pending", "localhost:9000", SIM),
    ]
    holdings = [holding_of(o, {}) for o in objs]
    floors = {"team-a/strict": 3}
    held, found = neighbours(holdings, floors.get, SIM, "team-b/loose", {"c1", "c2", "c3"})
    assert held == {"c1": "team-a/strict"}
    assert found == [Floor("team-a/strict", frozenset({"c1", "c2", "c3"}), 3)]


def test_a_clusterupgrade_pinned_before_identities_is_mapped_by_its_endpoint() -> None:
    old = _cu("team-a", "old", "c1", "ServicingOut", "sim-plugin:9000", None)
    # The controller reached sim-plugin:9000 and learned what it is.
    mapped = holding_of(old, {"sim-plugin:9000": SIM})
    assert mapped.provider == SIM and mapped.holds
    held, _ = neighbours([mapped], lambda run: 2, SIM, "team-b/new", {"c1"})
    assert held == {"c1": "team-a/old"}
    # Not reached yet: the endpoint fallback, which does not meet SIM.
    assert holding_of(old, {}).provider == endpoint_identity("sim-plugin:9000")


def test_finished_runs_bind_no_floor_and_other_providers_are_not_neighbours() -> None:
    other = provider_identity("sim.fleetupgrade.io", "fleet-b", "x:1")
    holdings = [
        holding_of(_cu("a", "done", "c1", "Upgraded", "x:1", SIM), {}),
        holding_of(_cu("a", "elsewhere", "c1", "ServicingOut", "y:1", other), {}),
        holding_of(_cu("b", "me", "c1", "Pending", "x:1", SIM), {}),
    ]
    held, found = neighbours(holdings, lambda run: None, SIM, "b/me", {"c1"})
    assert held == {} and found == []


def test_the_least_run_is_named_where_several_hold_one_cluster() -> None:
    holdings = [
        holding_of(_cu("z", "r", "c1", "ServicingIn", "x:1", SIM), {}),
        holding_of(_cu("a", "r", "c1", "Verifying", "x:1", SIM), {}),
    ]
    held, _ = neighbours(holdings, lambda run: 1, SIM, "m/me", {"c1"})
    assert held == {"c1": "a/r"}


def test_the_finished_phases_are_one_definition() -> None:
    assert {
        api.RunPhase.SUCCEEDED,
        api.RunPhase.FAILED,
        api.RunPhase.STOPPED,
    } == api.FINISHED_PHASES
    # Invalid is live: what it took out may still be out, and a fixed spec resumes it.
    assert api.run_is_live(api.RunPhase.INVALID)
    assert api.run_is_live(None)
    assert not api.run_is_live("Succeeded")


def test_supersede_stops_every_other_live_run_not_stopped_yet() -> None:
    from orchestrator.engine.initialize import superseded

    runs = [
        ("cv-new", "Run", None),
        ("cv-old", "Run", "Progressing"),
        ("cv-halted", "Run", "Halted"),
        ("cv-stopping", "Stop", "Stopping"),
        ("cv-done", "Run", "Succeeded"),
        ("cv-invalid", "Run", "Invalid"),
        ("cv-fresh", "Run", None),
    ]
    assert superseded(runs, "cv-new") == ["cv-old", "cv-halted", "cv-fresh"]
    # An invalid ClusterVersion wants no run: every live one stops.
    assert superseded(runs, "") == ["cv-new", "cv-old", "cv-halted", "cv-fresh"]


def test_live_fields_follow_the_cluster_version_in_place() -> None:
    from orchestrator.engine.initialize import live_fields

    cv = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 3,
            "opsEndpoint": {"endpoint": "x:1", "insecure": True},
            "clusters": [{"id": "c1", "version": "1.29.1"}],
            "strategy": {"paused": True},
            "skip": {"clusters": ["c1"]},
        }
    )
    stored = {"requiredAvailableCount": 2, "strategy": {"maxConcurrency": 2}, "retry": {"round": 1}}
    assert live_fields(stored, cv) == {
        "requiredAvailableCount": 3,
        "strategy": {"paused": True},
        "skip": {"clusters": ["c1"]},
        "retry": None,
    }
    same = {"requiredAvailableCount": 3, "strategy": {"paused": True}, "skip": {"clusters": ["c1"]}}
    assert live_fields(same, cv) == {}


def test_a_run_whose_floor_is_unknown_stops_the_decision() -> None:
    """Seed 6959 (watch-cache lag): another run's ClusterUpgrades were read before its
    UpdateRun; its floor must not be taken as None (binds nothing)."""
    from orchestrator.pipeline.crossrun import UNSEEN, RunNotSeen

    holdings = [holding_of(_cu("a", "other", "c1", "Pending", "x:1", SIM), {})]
    try:
        neighbours(holdings, lambda run: UNSEEN, SIM, "b/me", {"c1"})
    except RunNotSeen as err:
        assert err.run == "a/other"
    else:
        raise AssertionError("an unseen run's floor was ignored")


def test_an_orphaned_clusterupgrade_holds_its_cluster_but_binds_no_floor() -> None:
    owned = _cu("a", "gone", "c1", "ServicingOut", "x:1", SIM)
    orphan = dict(owned, metadata={**owned["metadata"], "ownerReferences": []})
    assert not holding_of(orphan, {}).owned and holding_of(owned, {}).owned
    held, floors = neighbours([holding_of(orphan, {})], lambda run: UNSEEN_RUN, SIM, "b/me", {"c1"})
    assert held == {"c1": "a/gone"} and floors == []


UNSEEN_RUN = -1


def test_an_ended_attempt_that_keeps_its_step_holds_its_cluster_until_it_lets_it_go() -> None:
    # Simulation seed 104873: a failed attempt of another run kept c1 out of service (its step
    # kept); a retry here took c1 for its own because that attempt held nothing once ended.
    failed = _cu("a", "other", "c1", "Failed", "x:1", SIM)
    failed["status"]["step"] = "upgradeControlPlane"
    held, _ = neighbours([holding_of(failed, {})], lambda run: None, SIM, "b/me", {"c1"})
    assert held == {"c1": "a/other"}
    for phase in ("Skipped", "Blocked"):
        kept = dict(failed, status={**failed["status"], "phase": phase})
        assert holding_of(kept, {}).holds, phase
    # Let go (`decide._released` cleared the step), or never taken: held by no one.
    released = dict(failed, status={"phase": "Failed"})
    upgraded = dict(failed, status={**failed["status"], "phase": "Upgraded"})
    for obj in (released, upgraded):
        assert neighbours([holding_of(obj, {})], lambda run: None, SIM, "b/me", {"c1"})[0] == {}
    # An orphan's kept step holds nothing: no run is left to let it go.
    orphan = dict(failed, metadata={**failed["metadata"], "ownerReferences": []})
    assert not holding_of(orphan, {}).holds
