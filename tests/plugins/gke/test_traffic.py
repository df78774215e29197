"""Service-out / service-in: capacityScaler 0 in the configured backend services, the old value
restored (also after a plugin restart); mode none records the state only."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.traffic import DRAIN_MARKER
from plugins.sdk.client import PluginCallError
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import (
    NEG,
    PROJECT,
    cluster_id,
    plugin_config,
    populate,
    running_plugin,
)
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_terminal, wait_until

C1, C2 = cluster_id("c1"), cluster_id("c2")
_S = cluster_pb2


def _backend(emulator: GkeEmulator, service: str, name: str) -> dict[str, object]:
    return next(
        b
        for b in emulator.backend_service(PROJECT, service)["backends"]
        if str(b["group"]).endswith(f"neg-{name}")
    )


def _two_services(emulator: GkeEmulator) -> dict[str, object]:
    emulator.add_backend_service(
        PROJECT,
        "api",
        [
            {"group": NEG.format(n), "capacityScaler": 0.8, "description": f"api backend {n}"}
            for n in NAMES
        ],
    )
    config = plugin_config(emulator, NAMES)
    config["traffic"]["backendServices"].append({"project": PROJECT, "name": "api"})
    return config


def test_service_out_sets_capacity_zero_and_service_in_restores_the_old_value(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(_two_services(emulator)).client
    out = client.service_out("out-1", C1)
    assert out.kind == _S.OPERATION_KIND_SERVICE_OUT
    assert out.state in (_S.OPERATION_STATE_PENDING, _S.OPERATION_STATE_RUNNING)
    assert wait_terminal(client, out.id).state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 0.0
    assert emulator.capacity(PROJECT, "api", "neg-c1") == 0.0
    assert f"[{DRAIN_MARKER}=0.8]" in str(_backend(emulator, "api", "c1")["description"])
    assert emulator.capacity(PROJECT, "api", "neg-c2") == 0.8  # others untouched
    assert not client.get_cluster(C1).in_service and client.get_cluster(C2).in_service
    again = client.service_out("out-2", C1)  # nothing left to do
    assert again.state == _S.OPERATION_STATE_SUCCEEDED and again.id != out.id
    back = wait_terminal(client, client.service_in("in-1", C1).id)
    assert back.state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 1.0
    assert emulator.capacity(PROJECT, "api", "neg-c1") == 0.8
    assert _backend(emulator, "api", "c1")["description"] == "api backend c1"
    assert client.get_cluster(C1).in_service
    assert emulator.calls("compute.backendServices.patch") == 4


def test_the_old_capacity_survives_a_plugin_restart(emulator: GkeEmulator) -> None:
    config = _two_services(emulator)
    with running_plugin(config) as first:
        op = first.client.service_out("out", C1)
        assert wait_terminal(first.client, op.id).state == _S.OPERATION_STATE_SUCCEEDED
    with running_plugin(config) as second:
        assert not second.client.get_cluster(C1).in_service
        op = second.client.service_in("in", C1)
        assert wait_terminal(second.client, op.id).state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.capacity(PROJECT, "api", "neg-c1") == 0.8
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 1.0


def test_a_partly_drained_cluster_counts_as_out_and_service_in_restores_it(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    config = _two_services(emulator)
    emulator.fail_next_patch(PROJECT, "api", "backend service update failed: quota exceeded")
    client = start_plugin(config).client
    failed = wait_terminal(client, client.service_out("out", C1).id)
    assert (failed.state, failed.error_code) == (_S.OPERATION_STATE_FAILED, "SERVICE_OUT_FAILED")
    assert "quota exceeded" in failed.error_message
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 0.0
    assert emulator.capacity(PROJECT, "api", "neg-c1") == 0.8
    assert not client.get_cluster(C1).in_service  # the floor must not count it
    back = wait_terminal(client, client.service_in("in", C1).id)
    assert back.state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 1.0
    assert client.get_cluster(C1).in_service


def test_concurrent_drains_of_one_backend_service_lose_no_update(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    ops: dict[str, str] = {}

    def drain(name: str) -> None:
        ops[name] = client.service_out(f"out-{name}", cluster_id(name)).id

    threads = [threading.Thread(target=drain, args=(n,)) for n in ("c1", "c2", "c3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, op_id in ops.items():
        assert wait_terminal(client, op_id).state == _S.OPERATION_STATE_SUCCEEDED, name
    assert [emulator.capacity(PROJECT, "web", f"neg-{n}") for n in NAMES] == [0, 0, 0, 1.0]


def test_a_cluster_without_configured_backends_cannot_be_drained(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    config = plugin_config(emulator, NAMES)
    del config["traffic"]["backends"][C2]
    client = start_plugin(config).client
    with pytest.raises(PluginCallError) as err:
        client.service_out("out", C2)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "traffic.backends" in err.value.message and C2 in err.value.message


def test_mode_none_succeeds_at_once_and_keeps_the_state_across_restarts(
    emulator: GkeEmulator, tmp_path: Path
) -> None:
    config = plugin_config(emulator, NAMES, mode="none", state_file=tmp_path / "state.json")
    with running_plugin(config) as first:
        op = first.client.service_out("out", C1)
        assert op.state == _S.OPERATION_STATE_SUCCEEDED
        assert not first.client.get_cluster(C1).in_service
    with running_plugin(config) as second:
        assert not second.client.get_cluster(C1).in_service
        assert second.client.get_operation(op.id).state == _S.OPERATION_STATE_SUCCEEDED
        assert second.client.service_out("out", C1).id == op.id
        assert second.client.service_in("in", C1).state == _S.OPERATION_STATE_SUCCEEDED
        assert second.client.get_cluster(C1).in_service
    assert emulator.calls("compute.backendServices.patch") == 0
    assert emulator.calls("compute.backendServices.get") == 0


def test_a_restart_mid_drain_resumes_the_same_compute_operation(tmp_path: Path) -> None:
    with GkeEmulator(compute_op_seconds=2.0) as emu:
        populate(emu, NAMES)
        config = plugin_config(emu, NAMES, state_file=tmp_path / "state.json")
        with running_plugin(config) as first:
            op = first.client.service_out("out", C1)
            wait_until(lambda: emu.calls("compute.backendServices.patch") == 1, what="patch sent")
        with running_plugin(config) as second:
            resumed = second.client.get_operation(op.id)
            assert resumed.state == _S.OPERATION_STATE_RUNNING
            final = wait_terminal(second.client, op.id)
            assert final.state == _S.OPERATION_STATE_SUCCEEDED
            assert not second.client.get_cluster(C1).in_service
        # The repeat carried the same compute requestId: one compute operation, not two.
        assert len(emu.state.compute_ops) == 1
        assert emu.capacity(PROJECT, "web", "neg-c1") == 0.0


# ----------------------------------------------------- compute's rules, checked against it


def test_a_missing_backend_service_marks_only_its_clusters_and_never_breaks_the_inventory(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    # c3 is also served through "edge" by a second NEG; "edge" then disappears (deleted, or
    # it is a regional backend service: a global GET answers 404 either way).
    edge = "projects/p/zones/l-a/networkEndpointGroups/neg-c3-edge"
    emulator.add_backend_service(
        PROJECT, "edge", [{"group": edge}, {"group": NEG.format("c4") + "-edge"}]
    )
    config = plugin_config(emulator, NAMES)
    config["traffic"]["backendServices"].append({"project": PROJECT, "name": "edge"})
    config["traffic"]["backends"][cluster_id("c3")].append(edge)
    client = start_plugin(config).client
    assert all(c.available and c.in_service for c in client.list_clusters())
    emulator.remove_backend_service(PROJECT, "edge")
    listed = {c.id: c for c in client.list_clusters()}
    c3 = listed.pop(cluster_id("c3"))
    assert not c3.available and not c3.in_service
    assert "projects/p/global/backendServices/edge not found" in c3.unavailable_reason
    assert "regional" in c3.unavailable_reason and "neg-c3-edge" in c3.unavailable_reason
    assert all(c.available and c.in_service for c in listed.values())
    assert client.get_cluster(cluster_id("c3")).unavailable_reason == c3.unavailable_reason
    with pytest.raises(PluginCallError) as err:
        client.service_out("out-c3", cluster_id("c3"))
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "backendServices/edge not found" in err.value.message
    # The others still drain through the services that exist.
    assert wait_terminal(client, client.service_out("out-c1", C1).id).state == (
        _S.OPERATION_STATE_SUCCEEDED
    )
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 0.0


def test_draining_the_only_backend_of_a_service_is_refused_up_front(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_backend_service(PROJECT, "solo", [{"group": NEG.format("c1")}])
    config = plugin_config(emulator, NAMES)
    config["traffic"]["backendServices"].append({"project": PROJECT, "name": "solo"})
    client = start_plugin(config).client
    with pytest.raises(PluginCallError) as err:
        client.service_out("out", C1)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "only backend of projects/p/global/backendServices/solo" in err.value.message
    assert "single backend" in err.value.message
    assert emulator.calls("compute.backendServices.patch") == 0
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 1.0
    assert emulator.capacity(PROJECT, "solo", "neg-c1") == 1.0


def test_a_drain_keeps_backend_fields_newer_than_the_pinned_client() -> None:
    with GkeEmulator(compute_op_seconds=0.1) as emu:
        populate(emu, NAMES, web=False)
        emu.add_backend_service(
            PROJECT,
            "web",
            [{"group": NEG.format(n), "futureBalancingHint": f"hint-{n}"} for n in NAMES],
        )
        with running_plugin(plugin_config(emu, NAMES)) as plugin:
            client = plugin.client
            out = wait_terminal(client, client.service_out("out", C1).id)
            assert out.state == _S.OPERATION_STATE_SUCCEEDED
            back = wait_terminal(client, client.service_in("in", C1).id)
            assert back.state == _S.OPERATION_STATE_SUCCEEDED
        hints = {
            str(b["group"]).rsplit("/", 1)[1]: b.get("futureBalancingHint")
            for b in emu.backend_service(PROJECT, "web")["backends"]
        }
        assert hints == {f"neg-{n}": f"hint-{n}" for n in NAMES}
        assert emu.capacity(PROJECT, "web", "neg-c1") == 1.0
        # What went over the wire: only backends (as read) and the fingerprint guard.
        bodies = emu.requests("compute.backendServices.patch")
        assert [sorted(body) for body in bodies] == [["backends", "fingerprint"]] * 2


def test_a_stale_fingerprint_is_re_read_and_retried(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.fail_http(
        "compute.backendServices.patch",
        412,
        "Invalid fingerprint: pass the backend service's current fingerprint.",
        reason="conditionNotMet",
    )
    out = wait_terminal(client, client.service_out("out", C1).id)
    assert out.state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 0.0
    assert emulator.calls("compute.backendServices.patch") == 2
    assert emulator.calls("compute.backendServices.get") >= 3  # plan, read, re-read, verify


def test_a_backend_service_owned_by_a_controller_is_refused_with_what_to_do_instead() -> None:
    with GkeEmulator() as emu:
        populate(emu, NAMES, web=False)
        emu.add_backend_service(
            PROJECT,
            "web",
            [{"group": NEG.format(n)} for n in NAMES],
            owner="https://gkehub.googleapis.com/v1/projects/p/locations/global/memberships/hub",
        )
        with running_plugin(plugin_config(emu, NAMES)) as plugin:
            with pytest.raises(PluginCallError) as err:
                plugin.client.service_out("out", C1)
            assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
            for needle in ("is managed by https://gkehub", "HTTPRoute", "traffic.backendServices"):
                assert needle in err.value.message, err.value.message
        assert emu.calls("compute.backendServices.patch") == 0


def test_a_drain_undone_by_a_controller_is_read_back_and_fails() -> None:
    # A controller that owns the service without saying so in orchestrationInfo reconciles
    # capacityScaler back: the re-read after compute's DONE shows it.
    with GkeEmulator(compute_op_seconds=0.1) as emu:
        populate(emu, NAMES, web=False)
        emu.add_backend_service(
            PROJECT, "web", [{"group": NEG.format(n)} for n in NAMES], controlled=True
        )
        with running_plugin(plugin_config(emu, NAMES)) as plugin:
            client = plugin.client
            failed = wait_terminal(client, client.service_out("out", C1).id)
            assert (failed.state, failed.error_code) == (
                _S.OPERATION_STATE_FAILED,
                "SERVICE_OUT_FAILED",
            )
            assert "changed back right after the drain" in failed.error_message
            assert "HTTPRoute" in failed.error_message
            assert client.get_cluster(C1).in_service  # the truth: it still takes traffic
        assert emu.capacity(PROJECT, "web", "neg-c1") == 1.0


@pytest.mark.parametrize("reason", ["rateLimitExceeded", "userRateLimitExceeded"])
def test_computes_rate_limit_is_retried_with_backoff_never_missing_credentials(
    emulator: GkeEmulator, start_plugin: StartPlugin, reason: str
) -> None:
    """Compute's rate quota answers HTTP 403 rateLimitExceeded (or userRateLimitExceeded):
    UNAVAILABLE and retryable, not "missing credentials" (final); a drain that meets it
    waits and goes through."""
    client = start_plugin().client
    emulator.set_quota("compute", 0)
    with pytest.raises(PluginCallError) as err:
        client.service_out("out-limited", C1)
    error = err.value
    assert error.code is grpc.StatusCode.UNAVAILABLE, error.message
    assert error.retryable and "rate quota" in error.message
    assert "roles/" not in error.message
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 1.0
    emulator.clear_quotas()
    # The shape of the other reason, injected once in the middle of the drain (the patch).
    emulator.fail_http(
        "compute.backendServices.patch", 403, "Rate Limit Exceeded", reason=reason, times=2
    )
    out = wait_terminal(client, client.service_out("out", C1).id)
    assert out.state == _S.OPERATION_STATE_SUCCEEDED, out.error_message
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 0.0
    assert emulator.calls("compute.backendServices.patch") == 3


def test_a_drain_under_a_compute_rate_quota_waits_and_succeeds(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """The emulator's quota: 3 compute calls per 2 s. A drain needs more: it meets the
    403 rateLimitExceeded, backs off, and ends SUCCEEDED with the backend at zero."""
    client = start_plugin().client
    emulator.set_quota("compute", 3, per_seconds=2.0)
    out = wait_terminal(client, client.service_out("out", C1).id, timeout=60)
    assert out.state == _S.OPERATION_STATE_SUCCEEDED, out.error_message
    assert emulator.capacity(PROJECT, "web", "neg-c1") == 0.0
    emulator.clear_quotas()


def _regional(emulator: GkeEmulator, config: dict[str, object]) -> dict[str, object]:
    """Service `zonal`: c1's three zonal NEGs (a regional cluster) and c2's one."""
    zones = [f"{NEG.format('c1')}-{z}" for z in ("a", "b", "c")]
    emulator.add_backend_service(
        PROJECT, "zonal", [{"group": g} for g in zones] + [{"group": NEG.format("c2")}]
    )
    traffic = config["traffic"]
    assert isinstance(traffic, dict)
    traffic["backendServices"].append({"project": PROJECT, "name": "zonal"})
    traffic["backends"][C1] = [*traffic["backends"][C1], *zones]
    return config


def test_a_drain_that_would_leave_a_service_no_serving_backend_is_refused(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    # Issue 20: a regional cluster's zonal NEGs are several backends of one service, so
    # compute's single-backend rule never fires; with c2 out, draining c1 would zero `zonal`.
    client = start_plugin(_regional(emulator, plugin_config(emulator, NAMES))).client
    assert wait_terminal(client, client.service_out("out-c2", C2).id).state == (
        _S.OPERATION_STATE_SUCCEEDED
    )
    patches = emulator.calls("compute.backendServices.patch")
    with pytest.raises(PluginCallError) as err:
        client.service_out("out-c1", C1)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "no serving backend" in err.value.message
    assert "projects/p/global/backendServices/zonal" in err.value.message
    assert "allowZeroCapacity" in err.value.message
    assert emulator.calls("compute.backendServices.patch") == patches  # nothing drained
    assert [emulator.capacity(PROJECT, "zonal", f"neg-c1-{z}") for z in "abc"] == [1.0] * 3
    assert client.get_cluster(C1).in_service
    # With c2 back, c1 drains: c2's backend keeps serving.
    assert wait_terminal(client, client.service_in("in-c2", C2).id).state == (
        _S.OPERATION_STATE_SUCCEEDED
    )
    assert wait_terminal(client, client.service_out("out-c1-2", C1).id).state == (
        _S.OPERATION_STATE_SUCCEEDED
    )
    assert [emulator.capacity(PROJECT, "zonal", f"neg-c1-{z}") for z in "abc"] == [0.0] * 3
    assert emulator.capacity(PROJECT, "zonal", "neg-c2") == 1.0


def test_a_user_who_opts_in_may_drain_a_service_to_zero(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    config = _regional(emulator, plugin_config(emulator, NAMES))
    traffic = config["traffic"]
    assert isinstance(traffic, dict)
    traffic["allowZeroCapacity"] = True
    client = start_plugin(config).client
    for name, cid in (("c2", C2), ("c1", C1)):
        assert wait_terminal(client, client.service_out(f"out-{name}", cid).id).state == (
            _S.OPERATION_STATE_SUCCEEDED
        )
    capacities = [emulator.capacity(PROJECT, "zonal", f"neg-c1-{z}") for z in "abc"]
    assert [*capacities, emulator.capacity(PROJECT, "zonal", "neg-c2")] == [0.0] * 4


def test_a_drain_undone_later_by_a_controllers_sync_makes_the_cluster_unavailable(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """Issue 20: a controller that rewrites capacityScaler on its next sync undoes a drain
    after the plugin's read-back. The inventory then tells: the cluster takes traffic (in
    service) and is unavailable with the reason, so the floor never counts it."""
    client = start_plugin().client
    assert wait_terminal(client, client.service_out("out", C1).id).state == (
        _S.OPERATION_STATE_SUCCEEDED
    )
    assert not client.get_cluster(C1).in_service
    emulator.controller_sync(PROJECT, "web")
    cluster = client.get_cluster(C1)
    assert cluster.in_service and not cluster.available
    assert "drain undone by another writer" in cluster.unavailable_reason
    assert "neg-c1 at 1" in cluster.unavailable_reason
    assert client.get_cluster(C2).available  # never drained: nothing to undo
    back = wait_terminal(client, client.service_in("in", C1).id)
    assert back.state == _S.OPERATION_STATE_SUCCEEDED
    cluster = client.get_cluster(C1)
    assert cluster.in_service and cluster.available, cluster.unavailable_reason
    assert DRAIN_MARKER not in str(_backend(emulator, "web", "c1").get("description", ""))
