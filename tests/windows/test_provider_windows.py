"""The contract's Cluster.maintenance_windows as the orchestrator reads them
(orchestrator.adapters.provider.cluster_from_pb): kinds, first start / end, RRULE and scope kept;
entries the contract marks malformed (no kind, a missing time) dropped."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator.adapters.provider import cluster_from_pb
from orchestrator.engine.observations import WindowObs


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(moment)
    return out


START = datetime(2026, 11, 28, 4, tzinfo=UTC)
END = datetime(2026, 11, 28, 10, tzinfo=UTC)


def test_windows_and_exclusions_travel_into_the_cluster_observation() -> None:
    cluster = cluster_pb2.Cluster(
        id="projects/p/locations/l/clusters/c",
        control_plane_version="1.29.4",
        maintenance_windows=[
            cluster_pb2.MaintenanceWindow(
                kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
                start_time=stamp(START),
                end_time=stamp(END),
                recurrence="FREQ=WEEKLY;BYDAY=SA,SU",
            ),
            cluster_pb2.MaintenanceWindow(
                kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION,
                name="freeze",
                start_time=stamp(START),
                end_time=stamp(datetime(2027, 1, 4, tzinfo=UTC)),
                scope="NO_MINOR_UPGRADES",
            ),
            # Malformed per the contract: no kind; no end; no start.
            cluster_pb2.MaintenanceWindow(start_time=stamp(START), end_time=stamp(END)),
            cluster_pb2.MaintenanceWindow(
                kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION, start_time=stamp(START)
            ),
            cluster_pb2.MaintenanceWindow(
                kind=cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW, end_time=stamp(END)
            ),
        ],
    )
    assert cluster_from_pb(cluster).maintenance_windows == (
        WindowObs("window", "", START, END, "FREQ=WEEKLY;BYDAY=SA,SU", ""),
        WindowObs(
            "exclusion", "freeze", START, datetime(2027, 1, 4, tzinfo=UTC), "", "NO_MINOR_UPGRADES"
        ),
    )
    bare = cluster_pb2.Cluster(id="c", control_plane_version="1.29.4")
    assert cluster_from_pb(bare).maintenance_windows == ()
