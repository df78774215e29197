"""Service-out and service-in by a NoSelect taint: Placements drop the cluster, others stay."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk import PluginCallError
from tests.plugins.ocm.conftest import OLD, RunningPlugin, StartPlugin, curator_config
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import MC, PLACEMENT, OcmEmulator

SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
TAINT_KEY = "fleetupgrade.io/service-out"


def _done(plugin: RunningPlugin, op: cluster_pb2.Operation) -> cluster_pb2.Operation:
    final: cluster_pb2.Operation = wait_for(
        f"operation {op.id} ends",
        lambda: (o := plugin.client.get_operation(op.id)).state in (3, 4) and o,
        timeout=15,
    )
    return final


@pytest.fixture
def placements(hub: KubeCluster) -> Iterator[Callable[..., str]]:
    """placements(name, match_labels, tolerations=None): a Placement in a fresh namespace."""
    api = hub.api_client()
    custom = k8s.CustomObjectsApi(api)
    namespace = f"apps-{uuid.uuid4().hex[:6]}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))

    def create(
        name: str, match_labels: dict[str, str], tolerations: list[dict[str, Any]] | None = None
    ) -> str:
        body = {
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "Placement",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "predicates": [
                    {"requiredClusterSelector": {"labelSelector": {"matchLabels": match_labels}}}
                ],
                "tolerations": tolerations or [],
            },
        }
        custom.create_namespaced_custom_object(
            PLACEMENT[0], PLACEMENT[1], namespace, PLACEMENT[2], body
        )
        return namespace

    yield create
    custom.delete_collection_namespaced_custom_object(
        PLACEMENT[0], PLACEMENT[1], namespace, PLACEMENT[2]
    )
    hub.delete_namespace(namespace)
    api.close()


def test_service_out_takes_the_cluster_out_of_placements_and_service_in_brings_it_back(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    placements: Callable[..., str],
) -> None:
    ids = names(3)
    group = ids[0]
    for name in ids:
        emulator.add_cluster(name, OLD, labels={"group": group})
    ns = placements("web", {"group": group})
    placements("ops-tools", {"group": group}, [{"key": TAINT_KEY, "operator": "Exists"}])
    plugin = start_plugin(curator_config())
    assert emulator.placement_decisions(ns, "web") == ids

    out = _done(plugin, plugin.client.service_out("out-1", ids[1]))
    assert out.state == SUCCEEDED and out.kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT
    taints = emulator.taints_of(ids[1])
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        (TAINT_KEY, "fleet-upgrade-orchestrator", "NoSelect")
    ]
    assert taints[0]["timeAdded"]
    assert not plugin.client.get_cluster(ids[1]).in_service
    assert emulator.placement_decisions(ns, "web") == [ids[0], ids[2]]
    assert emulator.placement_decisions(ns, "ops-tools") == ids  # it tolerates the taint

    again = plugin.client.service_out("out-2", ids[1])  # already out: nothing to do
    assert again.state == SUCCEEDED and again.id != out.id

    back = _done(plugin, plugin.client.service_in("in-1", ids[1]))
    assert back.state == SUCCEEDED
    assert emulator.taints_of(ids[1]) == []
    assert plugin.client.get_cluster(ids[1]).in_service
    assert emulator.placement_decisions(ns, "web") == ids

    assert plugin.client.service_out("out-1", ids[1]).id == out.id  # same request, same op


def test_the_taint_code_never_removes_a_foreign_taint(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    maintenance = {"key": "example.com/maintenance", "value": "db", "effect": "PreferNoSelect"}
    same_key = {"key": TAINT_KEY, "value": "set-by-an-operator", "effect": "NoSelect"}
    emulator.add_foreign_taint(name, maintenance)
    emulator.add_foreign_taint(name, same_key)
    emulator.set_available(name, "Unknown", "LeaseExpired", "no lease for 5 minutes")
    plugin = start_plugin(curator_config())
    before = emulator.taints_of(name)
    assert len(before) == 3
    cluster = plugin.client.get_cluster(name)
    assert cluster.in_service, "a taint with our key but another value is not ours"
    assert not cluster.available and "is Unknown (LeaseExpired)" in cluster.unavailable_reason

    _done(plugin, plugin.client.service_out("out", name))
    after_out = emulator.taints_of(name)
    assert after_out[:3] == before
    assert len(after_out) == 4 and after_out[3]["value"] == "fleet-upgrade-orchestrator"

    _done(plugin, plugin.client.service_in("in", name))
    assert emulator.taints_of(name) == before
    emulator.set_available(name, "True")
    remaining = {t["key"] for t in emulator.taints_of(name)}
    assert remaining == {"example.com/maintenance", TAINT_KEY}
    assert plugin.client.service_in("in-again", name).state == SUCCEEDED  # nothing of ours left
    assert len(emulator.taints_of(name)) == 2


OUR_TAINT = {"key": TAINT_KEY, "value": "fleet-upgrade-orchestrator", "effect": "NoSelect"}
TEAM_A = {"key": TAINT_KEY, "value": "team-a", "effect": "NoSelect"}
TEAM_B = {"key": TAINT_KEY, "value": "team-b", "effect": "PreferNoSelect"}
MAINTENANCE = {"key": "example.com/maintenance", "value": "db", "effect": "PreferNoSelect"}


def _plain(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints]


@pytest.mark.parametrize(
    "order",
    [
        pytest.param([TEAM_A, OUR_TAINT], id="foreign-first"),
        pytest.param([OUR_TAINT, TEAM_A], id="ours-first"),
        pytest.param([TEAM_A, OUR_TAINT, MAINTENANCE, TEAM_B], id="several-ours-between"),
        pytest.param([OUR_TAINT, TEAM_B, MAINTENANCE, TEAM_A], id="several-ours-first"),
    ],
)
def test_service_in_and_out_succeed_whatever_the_order_of_taints_sharing_our_key(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    order: list[dict[str, Any]],
) -> None:
    """Someone else uses our taint key with another value, before or after ours. The hub's
    webhook compares every taint sent with the first old taint of its key, so sending the list
    back as read is denied; each write of the plugin passes, ours goes and comes back, and
    every foreign taint keeps its key, value and effect, in place."""
    [name] = names(1)
    emulator.add_cluster(name, OLD, taints=order)
    foreign = [t for t in order if t != OUR_TAINT]
    assert _plain(emulator.taints_of(name)) == order
    plugin = start_plugin(curator_config())
    assert not plugin.client.get_cluster(name).in_service

    # Out while ours is there already: the ledger alone is written (the same webhook).
    out = _done(plugin, plugin.client.service_out("out-0", name))
    assert (out.state, out.error_message) == (SUCCEEDED, "")
    assert _plain(emulator.taints_of(name)) == order

    back = _done(plugin, plugin.client.service_in("in-1", name))
    assert (back.state, back.error_message) == (SUCCEEDED, "")
    assert _plain(emulator.taints_of(name)) == foreign
    assert plugin.client.get_cluster(name).in_service

    again = _done(plugin, plugin.client.service_out("out-1", name))
    assert (again.state, again.error_message) == (SUCCEEDED, "")
    assert _plain(emulator.taints_of(name)) == [*foreign, OUR_TAINT]
    assert not plugin.client.get_cluster(name).in_service
    assert all(t.get("timeAdded") for t in emulator.taints_of(name))

    final = _done(plugin, plugin.client.service_in("in-2", name))
    assert (final.state, final.error_message) == (SUCCEEDED, "")
    assert _plain(emulator.taints_of(name)) == foreign


def test_concurrent_writers_lose_nothing_read_modify_write_retries_on_conflict(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(curator_config())
    stop = threading.Event()
    added: list[str] = []
    errors: list[BaseException] = []

    def other_tool() -> None:
        """Another writer: adds its own taints and bumps labels as fast as it can."""
        api = hub.api_client()
        custom = k8s.CustomObjectsApi(api)
        count = 0
        try:
            while not stop.is_set():
                count += 1
                if count % 4 == 0:
                    key = f"example.com/t{count}"
                    emulator.add_foreign_taint(name, {"key": key, "effect": "PreferNoSelect"})
                    added.append(key)
                else:
                    custom.patch_cluster_custom_object(
                        *MC, name, {"metadata": {"labels": {"churn": str(count)}}}
                    )
        except BaseException as exc:
            errors.append(exc)
        finally:
            api.close()

    def asked(
        call: Callable[[str, str], cluster_pb2.Operation], request: str
    ) -> cluster_pb2.Operation:
        """The call, asked again with the same request id while the plugin answers that the
        object kept changing (retryable UNAVAILABLE after its own read-modify-write retries),
        as the orchestrator does; a writer as fast as it can may win a few rounds in a row on a
        loaded machine, never every one."""
        for _ in range(5):
            try:
                return call(request, name)
            except PluginCallError as err:
                if not (err.retryable and "kept changing" in err.message):
                    raise
        return call(request, name)

    writer = threading.Thread(target=other_tool)
    writer.start()
    try:
        for round_ in range(4):
            _done(plugin, asked(plugin.client.service_out, f"out-{round_}"))
            _done(plugin, asked(plugin.client.service_in, f"in-{round_}"))
    finally:
        stop.set()
        writer.join(timeout=10)
    assert not errors
    assert len(added) >= 2
    keys = [t["key"] for t in emulator.taints_of(name)]
    assert keys == added  # every foreign taint survived, in order; ours is gone


def test_service_out_ends_once_the_placement_controller_has_dropped_the_cluster(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    placements: Callable[..., str],
) -> None:
    """Issue 20 item 5: the placement controller drops a NoSelect-tainted cluster from its
    PlacementDecisions asynchronously; "out of service" is true only then. A Placement that
    tolerates the taint keeps the cluster by design and is not waited for."""
    ids = names(2)
    group = ids[0]
    for name in ids:
        emulator.add_cluster(name, OLD, labels={"group": group})
    ns = placements("web", {"group": group})
    placements("ops-tools", {"group": group}, [{"key": TAINT_KEY, "operator": "Exists"}])
    wait_for("the decisions list both", lambda: emulator.decided(ns, "web") == ids, timeout=15)
    emulator.placement_lag = 2.0
    plugin = start_plugin(curator_config())
    op = plugin.client.service_out("out-1", ids[1])
    wait_for("the taint is on the hub", lambda: bool(emulator.taints_of(ids[1])), timeout=10)
    # The taint is there, the decision still sends the web workload to the cluster: not out.
    still = plugin.client.get_operation(op.id)
    assert still.state == cluster_pb2.OPERATION_STATE_RUNNING, still
    assert ids[1] in emulator.decided(ns, "web")
    done = _done(plugin, op)
    assert done.state == SUCCEEDED
    assert emulator.decided(ns, "web") == [ids[0]]  # dropped before the operation ended
    assert emulator.decided(ns, "ops-tools") == ids  # tolerates the taint: keeps it


def test_without_waiting_for_placements_service_out_ends_with_the_taint(
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    placements: Callable[..., str],
) -> None:
    ids = names(2)
    for name in ids:
        emulator.add_cluster(name, OLD, labels={"group": ids[0]})
    ns = placements("web", {"group": ids[0]})
    wait_for("the decision lists both", lambda: emulator.decided(ns, "web") == ids, timeout=15)
    emulator.placement_lag = 30.0
    plugin = start_plugin(curator_config(taint={"key": TAINT_KEY, "waitForPlacements": False}))
    done = _done(plugin, plugin.client.service_out("out-1", ids[1]))
    assert done.state == SUCCEEDED
    assert ids[1] in emulator.decided(ns, "web")  # the controller has not caught up yet
