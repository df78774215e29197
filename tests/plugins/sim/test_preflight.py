"""PreflightUpgrade of the sim: the verdict of the rules its mutations enforce, starting nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.sim.conftest import StartSim
from tests.plugins.sim.support import small_fleet

ACCEPTED = cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
LATER = cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER
NEVER = cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER


@pytest.mark.parametrize(
    ("control_plane", "pools", "verdict", "reason"),
    [
        ("1.29.4", {}, ACCEPTED, ""),
        ("1.29.4", {"p1": "1.29.4", "p2": "1.29.0"}, ACCEPTED, ""),
        ("", {"p1": "1.28.5"}, ACCEPTED, ""),
        ("1.30.1", {}, NEVER, "MINOR_VERSION_SKIP"),
        ("1.27.9", {}, NEVER, "DOWNGRADE_NOT_SUPPORTED"),
        ("", {"p1": "1.29.4"}, NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE"),
        ("1.29.4", {"p1": "1.29.5"}, NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE"),
    ],
)
def test_the_verdict_follows_the_version_rules(
    start_sim: StartSim, control_plane: str, pools: dict[str, str], verdict: int, reason: str
) -> None:
    run = start_sim(small_fleet())
    answer = run.client.preflight_upgrade("c1", control_plane, pools)
    assert (answer.verdict, answer.reason_code) == (verdict, reason)
    assert bool(answer.message) is (verdict != ACCEPTED)
    # Read-only: nothing started, nothing changed.
    cluster = run.client.get_cluster("c1")
    assert not cluster.HasField("current_operation")
    assert cluster.control_plane_version == "1.28.5"
    assert run.sim.monitor.snapshot()["mutations_total"] == 0


def test_a_refused_never_verdict_matches_the_mutations_refusal(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    answer = run.client.preflight_upgrade("c1", "1.30.1")
    with pytest.raises(PluginCallError) as refused:
        run.client.upgrade_control_plane("cp", "c1", "1.30.1")
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.reason == answer.reason_code == "MINOR_VERSION_SKIP"
    assert refused.value.message == answer.message
    assert not refused.value.retryable


def test_a_busy_cluster_is_refused_for_later_with_the_time_left(start_sim: StartSim) -> None:
    run = start_sim(small_fleet(step=3.0))
    op = run.client.service_out("out", "c1")
    busy = run.client.preflight_upgrade("c1", "1.29.4")
    assert (busy.verdict, busy.reason_code) == (LATER, "CLUSTER_BUSY")
    assert op.id in busy.message
    assert 1 <= busy.retry_after_seconds <= 3
    # A version that is never acceptable says never, even while the cluster is busy.
    never = run.client.preflight_upgrade("c1", "1.30.0")
    assert never.verdict == NEVER
    assert run.client.preflight_upgrade("c2", "1.29.4").verdict == ACCEPTED


def test_unknown_cluster_and_pool_are_not_found(start_sim: StartSim) -> None:
    run = start_sim(small_fleet())
    for cluster_id, pools in (("zz", {}), ("c1", {"gpu": "1.28.5"})):
        with pytest.raises(PluginCallError) as missing:
            run.client.preflight_upgrade(cluster_id, "1.29.4", pools)
        assert missing.value.code is grpc.StatusCode.NOT_FOUND


def test_refused_versions_and_open_exclusions_are_refused_with_their_reason(
    start_sim: StartSim,
) -> None:
    now = datetime.now(UTC)
    fleet = small_fleet(
        faults={
            "refuseVersions": [
                {"versions": ["1.29.4"], "clusters": ["c1"]},
                {"versions": ["1.29.5"], "reason": "CAPACITY", "retryAfter": 60},
            ]
        }
    )
    fleet["clusters"][2]["maintenanceWindows"] = [
        {
            "kind": "exclusion",
            "name": "freeze",
            "start": (now - timedelta(hours=1)).isoformat(),
            "end": (now + timedelta(hours=2)).isoformat(),
            "scope": "NO_UPGRADES",
            "refuseUpgrades": True,
        },
        {
            "kind": "window",
            "start": "2026-01-03T02:00:00Z",
            "end": "2026-01-03T06:00:00Z",
            "recurrence": "FREQ=WEEKLY;BYDAY=SA",
        },
    ]
    run = start_sim(fleet)
    client = run.client
    not_offered = client.preflight_upgrade("c1", "1.29.4")
    assert (not_offered.verdict, not_offered.reason_code) == (NEVER, "VERSION_NOT_OFFERED")
    assert client.preflight_upgrade("c2", "1.29.4").verdict == ACCEPTED
    capacity = client.preflight_upgrade("c2", "1.29.5")
    assert (capacity.verdict, capacity.reason_code, capacity.retry_after_seconds) == (
        LATER,
        "CAPACITY",
        60,
    )
    with pytest.raises(PluginCallError) as refused:
        client.upgrade_control_plane("cp", "c2", "1.29.5")
    assert (refused.value.reason, refused.value.retryable, refused.value.retry_after) == (
        "CAPACITY",
        True,
        60.0,
    )
    frozen = client.preflight_upgrade("c3", "1.29.4")
    assert (frozen.verdict, frozen.reason_code) == (LATER, "MAINTENANCE_EXCLUSION")
    assert 7000 < frozen.retry_after_seconds <= 7200
    windows = client.get_cluster("c3").maintenance_windows
    assert [(w.kind, w.name, w.scope, w.recurrence) for w in windows] == [
        (cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION, "freeze", "NO_UPGRADES", ""),
        (cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW, "", "", "FREQ=WEEKLY;BYDAY=SA"),
    ]
    assert windows[1].start_time.ToJsonString() == "2026-01-03T02:00:00Z"
    assert client.get_cluster("c1").maintenance_windows == []
