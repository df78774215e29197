"""Traffic drain through Route 53 weighted records: ServiceOut sets the cluster's records to
weight 0 and ends once Route 53 is INSYNC and the TTL has passed; ServiceIn restores the
configured weight; the last serving record of a group is never zeroed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.eks.conftest import NAMES, StartPlugin
from tests.plugins.eks.support import (
    RECORD,
    ZONE,
    cluster_id,
    plugin_config,
    route53_traffic,
    running_plugin,
)
from tests.support.eks_emulator import EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.plugin_harness import wait_terminal

SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING


def test_service_out_and_in_move_the_weight_and_wait_for_insync(
    route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(traffic=route53_traffic(route53, NAMES)).client
    out = client.service_out("r-out", cluster_id("c2"))
    assert out.state == RUNNING and route53.weight(ZONE, RECORD, "c2") == 0
    assert client.get_cluster(cluster_id("c2")).in_service is False
    assert wait_terminal(client, out.id).state == SUCCEEDED
    assert route53.calls("GetChange") >= 1
    # The same request again: the same operation, no second change.
    assert client.service_out("r-out", cluster_id("c2")).id == out.id
    assert route53.calls("ChangeResourceRecordSets") == 1
    back = client.service_in("r-in", cluster_id("c2"))
    assert wait_terminal(client, back.id).state == SUCCEEDED
    assert route53.weight(ZONE, RECORD, "c2") == 100
    assert client.get_cluster(cluster_id("c2")).in_service
    assert [route53.weight(ZONE, RECORD, n) for n in ("c1", "c3", "c4")] == [100, 100, 100]
    # In service already: nothing to change.
    assert client.service_in("r-in-2", cluster_id("c2")).state == SUCCEEDED
    assert route53.calls("ChangeResourceRecordSets") == 2


def test_the_drain_waits_the_records_ttl_after_insync(
    route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    traffic = route53_traffic(route53, NAMES, ttl=1)
    del traffic["route53"]["drainSeconds"]
    client = start_plugin(traffic=traffic).client
    started = time.monotonic()
    op = client.service_out("r-out", cluster_id("c1"))
    assert wait_terminal(client, op.id).state == SUCCEEDED
    assert time.monotonic() - started >= 0.2 + 1.0  # INSYNC, then one TTL


def test_the_last_serving_record_of_a_group_is_never_zeroed(
    route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(traffic=route53_traffic(route53, NAMES[:2])).client
    wait_terminal(client, client.service_out("r-1", cluster_id("c1")).id)
    with pytest.raises(PluginCallError) as err:
        client.service_out("r-2", cluster_id("c2"))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "last non-zero weight" in str(err.value)
    assert route53.weight(ZONE, RECORD, "c2") == 100


def test_a_missing_record_makes_the_cluster_unavailable_and_refuses_service_out(
    route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    traffic = route53_traffic(route53, NAMES[:2])
    traffic["route53"]["records"][cluster_id("c3")] = [
        {"hostedZoneId": ZONE, "name": RECORD, "setIdentifier": "gone", "weight": 10}
    ]
    client = start_plugin(traffic=traffic).client
    cluster = client.get_cluster(cluster_id("c3"))
    assert not cluster.available and "gone" in cluster.unavailable_reason
    with pytest.raises(PluginCallError) as err:
        client.service_out("r", cluster_id("c3"))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    # A cluster without configured records drains nothing and is in service.
    assert client.get_cluster(cluster_id("c4")).in_service


def test_throttled_changes_are_unavailable_and_change_nothing(
    route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(traffic=route53_traffic(route53, NAMES)).client
    route53.inject("ChangeResourceRecordSets", "PriorRequestNotComplete", count=5)
    with pytest.raises(PluginCallError) as err:
        client.service_out("r", cluster_id("c1"))
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert route53.weight(ZONE, RECORD, "c1") == 100
    assert wait_terminal(client, client.service_out("r", cluster_id("c1")).id).state == SUCCEEDED
    assert route53.weight(ZONE, RECORD, "c1") == 0


def test_a_drain_in_flight_is_finished_after_a_restart(
    emulator: EksEmulator, route53: Route53Emulator, tmp_path: Path
) -> None:
    route53.sync_seconds = 5.0
    config = plugin_config(
        emulator, state_file=tmp_path / "ops.jsonl", traffic=route53_traffic(route53, NAMES)
    )
    with running_plugin(config) as first:
        op = first.client.service_out("r-out", cluster_id("c1"))
        assert op.state == RUNNING
    route53.sync_seconds = 0.1
    with running_plugin(config) as second:
        assert wait_terminal(second.client, op.id).state == SUCCEEDED
        assert not second.client.get_cluster(cluster_id("c1")).in_service
    assert route53.weight(ZONE, RECORD, "c1") == 0


def test_two_clusters_of_one_group_drained_at_once_leave_one_serving(
    route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(traffic=route53_traffic(route53, NAMES[:2])).client
    outcomes: dict[str, str] = {}

    def drain(name: str) -> None:
        try:
            client.service_out(f"r-{name}", cluster_id(name))
            outcomes[name] = "out"
        except PluginCallError as exc:
            outcomes[name] = exc.code.name

    threads = [threading.Thread(target=drain, args=(n,)) for n in NAMES[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes.values()) == ["FAILED_PRECONDITION", "out"]
    weights = [route53.weight(ZONE, RECORD, n) for n in NAMES[:2]]
    assert sorted(weights) == [0, 100]
