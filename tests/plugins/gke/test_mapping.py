"""GKE's operation and link formats mapped onto the contract (pure functions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.cloud import container_v1

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.ids import (
    Target,
    group_key,
    parse_cluster_id,
    parse_operation_id,
    parse_target,
    parse_target_link,
)
from plugins.gke.operations import by_start, contract_state, describe, progress_percent
from plugins.gke.windows import maintenance_windows

_Status = container_v1.Operation.Status
_S = cluster_pb2


def _op(**fields: object) -> container_v1.Operation:
    return container_v1.Operation(**fields)


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (_Status.PENDING, _S.OPERATION_STATE_PENDING),
        (_Status.RUNNING, _S.OPERATION_STATE_RUNNING),
        (_Status.ABORTING, _S.OPERATION_STATE_RUNNING),
        (_Status.DONE, _S.OPERATION_STATE_SUCCEEDED),
    ],
)
def test_statuses_map_onto_contract_states(status: int, state: int) -> None:
    assert contract_state(_op(name="operation-1", status=status)) == (state, "", "")


def test_done_with_an_error_fails_with_the_message_and_code() -> None:
    failed = _op(name="operation-1", status=_Status.DONE, error={"code": 13, "message": "boom"})
    assert contract_state(failed, "projects/p/locations/l/operations/operation-1") == (
        _S.OPERATION_STATE_FAILED,
        "UPGRADE_FAILED",
        "GKE operation projects/p/locations/l/operations/operation-1 failed: boom",
    )
    cancelled = _op(name="op", status=_Status.DONE, error={"code": 1, "message": "cancelled"})
    assert contract_state(cancelled)[1] == "CANCELLED"
    legacy = _op(name="op", status=_Status.DONE, status_message="nodes failed to register")
    assert contract_state(legacy)[0] == _S.OPERATION_STATE_FAILED


def test_progress_comes_from_either_documented_metric_bundle() -> None:
    nodes = _op(
        progress={
            "metrics": [
                {"name": "nodes done", "int_value": 3},
                {"name": "nodes total", "int_value": 12},
            ]
        }
    )
    assert progress_percent(nodes) == 25
    ratio = _op(
        progress={
            "metrics": [
                {"name": "progress", "double_value": 0.56},
                {"name": "progress scale", "double_value": 1.0},
            ]
        }
    )
    assert progress_percent(ratio) == 56
    assert progress_percent(_op()) == 0


def test_target_links_with_numbers_zones_and_node_pools() -> None:
    base = "https://container.googleapis.com/v1/projects/123456789012"
    assert parse_target_link(f"{base}/zones/us-central1-a/clusters/c1") == (
        "us-central1-a",
        "c1",
        "",
    )
    assert parse_target_link(f"{base}/locations/us-central1/clusters/c1/nodePools/np") == (
        "us-central1",
        "c1",
        "np",
    )
    assert parse_target_link(f"{base}/locations/us-central1") is None
    op = _op(
        name="operation-9",
        location="us-central1",
        operation_type=container_v1.Operation.Type.UPGRADE_NODES,
        status=_Status.RUNNING,
        target_link=f"{base}/locations/us-central1/clusters/c1/nodePools/np",
    )
    info = describe(op, "my-project")
    assert info is not None
    assert info.op_id == "projects/my-project/locations/us-central1/operations/operation-9"
    assert (info.kind, info.node_pool, info.in_flight) == (
        _S.OPERATION_KIND_UPGRADE_NODE_POOL,
        "np",
        True,
    )


def test_ids_and_group_urls() -> None:
    assert parse_cluster_id("projects/p/locations/l/clusters/c").name == "c"
    assert parse_cluster_id("cluster-1") is None
    assert parse_operation_id("projects/p/locations/l/operations/op").name == "op"
    assert parse_operation_id("gke-op-123") is None
    short = "projects/p/zones/z/networkEndpointGroups/neg"
    assert group_key(f"https://www.googleapis.com/compute/v1/{short}") == short
    assert group_key(f"https://compute.googleapis.com/compute/v1/{short}/") == short
    assert group_key(short) == short


def test_node_level_target_links_of_repairs() -> None:
    base = "https://container.googleapis.com/v1/projects/123456789012/zones/us-central1-a"
    link = f"{base}/clusters/c1/nodePools/np/node/gke-c1-np-4f2a"
    assert parse_target(link) == Target("us-central1-a", "c1", "np", "gke-c1-np-4f2a")
    assert parse_target_link(link) == ("us-central1-a", "c1", "np")
    repair = _op(
        name="operation-7",
        zone="us-central1-a",
        operation_type=container_v1.Operation.Type.AUTO_REPAIR_NODES,
        status=_Status.RUNNING,
        target_link=link,
    )
    info = describe(repair, "p")
    assert info is not None
    # In flight on the cluster (it blocks other operations), but not a pool upgrade.
    assert (info.cluster, info.node_pool, info.node, info.kind, info.in_flight) == (
        "c1",
        "np",
        "gke-c1-np-4f2a",
        0,
        True,
    )
    assert info.what == "AUTO_REPAIR_NODES of node gke-c1-np-4f2a in pool np"


def test_operations_are_ordered_by_start_time_whatever_the_listing_order() -> None:
    ops = [
        _op(name="b", start_time="2026-01-01T10:00:00.5Z"),
        _op(name="a", start_time="2026-01-01T09:59:59.999999999Z"),
        _op(name="c", start_time="2026-01-01T10:00:00Z"),
    ]
    assert [op.name for op in by_start(ops)] == ["a", "c", "b"]


@pytest.mark.parametrize(
    ("now", "start"),
    [
        (datetime(2026, 3, 2, 1, 0, tzinfo=UTC), datetime(2026, 3, 2, 3, 30, tzinfo=UTC)),
        (datetime(2026, 3, 2, 5, 0, tzinfo=UTC), datetime(2026, 3, 2, 3, 30, tzinfo=UTC)),
        (datetime(2026, 3, 2, 8, 0, tzinfo=UTC), datetime(2026, 3, 3, 3, 30, tzinfo=UTC)),
    ],
    ids=["before-today", "inside-today", "after-today"],
)
def test_a_daily_window_is_reported_as_its_current_or_next_occurrence(
    now: datetime, start: datetime
) -> None:
    cluster = container_v1.Cluster(
        maintenance_policy={
            "window": {"daily_maintenance_window": {"start_time": "03:30", "duration": "PT4H"}}
        }
    )
    (window,) = maintenance_windows(cluster, now)
    assert window.kind == _S.MAINTENANCE_WINDOW_KIND_WINDOW
    assert window.recurrence == "FREQ=DAILY"
    assert window.start_time.ToDatetime(tzinfo=UTC) == start
    assert window.end_time.ToDatetime(tzinfo=UTC) == start + timedelta(hours=4)


def test_a_recurring_maintenance_window_keeps_its_rrule() -> None:
    cluster = container_v1.Cluster(
        maintenance_policy={
            "window": {
                "recurring_maintenance_window": {
                    "delay_until": {"year": 2026, "month": 2, "day": 1},
                    "window_start_time": {"hours": 2, "minutes": 30},
                    "window_duration": {"seconds": 30 * 3600},
                    "recurrence": "FREQ=WEEKLY;BYDAY=SU",
                }
            }
        }
    )
    (window,) = maintenance_windows(cluster)
    start = datetime(2026, 2, 1, 2, 30, tzinfo=UTC)
    assert (window.kind, window.recurrence) == (
        _S.MAINTENANCE_WINDOW_KIND_WINDOW,
        "FREQ=WEEKLY;BYDAY=SU",
    )
    assert window.start_time.ToDatetime(tzinfo=UTC) == start
    assert window.end_time.ToDatetime(tzinfo=UTC) == start + timedelta(hours=30)
