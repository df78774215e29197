"""GKE maintenance policies from the emulator's REST answer, through the plugin's ListClusters,
into the orchestrator's ClusterObs and its window gate: what GKE reports is what the run honours
(per maintenance.providerWindows), while the plugin itself lets the upgrade through."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator import api
from orchestrator.adapters.provider import cluster_from_pb
from orchestrator.engine.observations import WindowObs
from orchestrator.engine.windows import gate
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import NEW, OLD, cluster_id, plugin_config
from tests.support.gke_emulator import GkeEmulator

# GKE's documented example: weekends, 04:00-10:00 UTC, recurring since 2019.
WEEKEND_START = datetime(2019, 1, 5, 4, tzinfo=UTC)
# 2026-11-23 is a Monday.
MONDAY = datetime(2026, 11, 23, 10, tzinfo=UTC)
SATURDAY = datetime(2026, 11, 28, 4, tzinfo=UTC)


def honouring(policy: str) -> api.Maintenance:
    return api.Maintenance.model_validate({"providerWindows": policy, "expectedDuration": "1h"})


def test_gke_policies_reach_the_gate_as_gke_states_them(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    now = datetime.now(UTC)
    weekly = emulator.add_cluster(
        cluster_id("weekly"),
        master_version=OLD,
        window={
            "start": WEEKEND_START,
            "end": WEEKEND_START + timedelta(hours=6),
            "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU",
        },
        exclusions=[
            {
                "name": "no-minor",
                "start": now - timedelta(days=1),
                "end": now + timedelta(days=30),
                "scope": "NO_MINOR_UPGRADES",
            }
        ],
    )
    daily = emulator.add_cluster(cluster_id("daily"), master_version=OLD, window={"daily": "03:30"})
    # The emulator answers with the real API's field names (google.container.v1 Cluster JSON).
    policy = emulator.cluster(weekly)["maintenancePolicy"]["window"]
    assert policy["recurringWindow"]["recurrence"] == "FREQ=WEEKLY;BYDAY=SA,SU"
    assert policy["recurringWindow"]["window"]["startTime"] == "2019-01-05T04:00:00Z"
    assert policy["recurringWindow"]["window"]["endTime"] == "2019-01-05T10:00:00Z"
    option = policy["maintenanceExclusions"]["no-minor"]["maintenanceExclusionOptions"]
    assert option == {"scope": "NO_MINOR_UPGRADES"}
    assert emulator.cluster(daily)["maintenancePolicy"]["window"]["dailyMaintenanceWindow"] == {
        "startTime": "03:30",
        "duration": "PT4H0M0S",
    }

    client = start_plugin(plugin_config(emulator, [*NAMES, "weekly", "daily"], mode="none")).client
    seen = {c.id: cluster_from_pb(c) for c in client.list_clusters()}
    reported = seen[weekly].maintenance_windows
    assert [(w.kind, w.name, w.recurrence, w.scope) for w in reported] == [
        ("window", "", "FREQ=WEEKLY;BYDAY=SA,SU", ""),
        ("exclusion", "no-minor", "", "NO_MINOR_UPGRADES"),
    ]
    assert (reported[0].start, reported[0].end) == (
        WEEKEND_START,
        WEEKEND_START + timedelta(hours=6),
    )
    assert seen[cluster_id("c1")].maintenance_windows == ()  # no policy, nothing reported

    # Windows: a Monday start waits for Saturday 04:00; on Saturday it goes.
    windows_only = honouring("Windows")
    closed = gate(windows_only, reported, MONDAY)
    assert (closed.may_start, closed.next_start) == (False, SATURDAY)
    assert closed.reason == "outside the provider's maintenance windows"
    assert gate(windows_only, reported, SATURDAY + timedelta(hours=5)).may_start
    assert gate(honouring("Off"), reported, MONDAY).may_start

    # Windows and exclusions, inside the NO_MINOR_UPGRADES exclusion: a patch goes on Saturday,
    # a minor upgrade waits for the exclusion's end.
    both = honouring("WindowsAndExclusions")
    saturday = now + timedelta(days=(5 - now.weekday()) % 7)
    opening = saturday.replace(hour=4, minute=0, second=0, microsecond=0)
    patch = gate(both, reported, opening, minor=False)
    assert patch.may_start
    minor = gate(both, reported, opening, minor=True)
    assert not minor.may_start
    assert minor.reason.startswith(
        "inside the provider's maintenance exclusion 'no-minor' (scope NO_MINOR_UPGRADES) until "
    )
    assert minor.next_start is not None and minor.next_start >= reported[1].end

    # The daily window: reported as its current or next occurrence, recurring every day.
    (window,) = seen[daily].maintenance_windows
    assert window == WindowObs(
        "window", "", window.start, window.start + timedelta(hours=4), "FREQ=DAILY"
    )
    assert (window.start.hour, window.start.minute) == (3, 30)
    later = window.start + timedelta(days=40, hours=2)
    assert gate(windows_only, (window,), later).may_start  # 05:30, 1h before it closes
    assert gate(windows_only, (window,), later + timedelta(hours=1, seconds=1)).next_start == (
        window.start + timedelta(days=41)
    )

    # Honouring is the orchestrator's choice: the plugin accepts a minor upgrade (1.28 -> 1.29)
    # inside the NO_MINOR_UPGRADES exclusion and outside the window (GKE lets manual upgrades
    # through), and starts it.
    verdict = client.preflight_upgrade(weekly, NEW).verdict
    assert verdict == cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
    op = client.upgrade_control_plane("minor-in-exclusion", weekly, NEW)
    assert (op.target_version, op.state != cluster_pb2.OPERATION_STATE_FAILED) == (NEW, True)
    assert emulator.requests("UpdateMaster") == [{"masterVersion": NEW}]


def test_an_exclusion_until_end_of_support_without_an_end_is_reported_until_further_notice(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    since = datetime(2026, 11, 1, tzinfo=UTC)
    frozen = emulator.add_cluster(
        cluster_id("frozen"),
        master_version=OLD,
        exclusions=[
            {
                "name": "eos",
                "start": since,
                "end": None,
                "scope": "NO_MINOR_OR_NODE_UPGRADES",
                "endTimeBehavior": "UNTIL_END_OF_SUPPORT",
            }
        ],
    )
    excluded = emulator.cluster(frozen)["maintenancePolicy"]["window"]["maintenanceExclusions"]
    assert excluded["eos"] == {
        "startTime": "2026-11-01T00:00:00Z",
        "maintenanceExclusionOptions": {
            "scope": "NO_MINOR_OR_NODE_UPGRADES",
            "endTimeBehavior": "UNTIL_END_OF_SUPPORT",
        },
    }
    client = start_plugin(plugin_config(emulator, [*NAMES, "frozen"], mode="none")).client
    (reported,) = cluster_from_pb(client.get_cluster(frozen)).maintenance_windows
    assert (reported.kind, reported.start, reported.end) == (
        "exclusion",
        since,
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
    )
    held = gate(honouring("WindowsAndExclusions"), (reported,), MONDAY, minor=False)
    assert (held.may_start, held.next_start) == (False, None)
    assert held.reason == (
        "inside the provider's maintenance exclusion 'eos' (scope NO_MINOR_OR_NODE_UPGRADES) "
        "until 9999-12-31T23:59:59Z; nothing opens within 400 days"
    )
