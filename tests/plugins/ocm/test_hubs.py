"""One plugin, several OCM hubs (kealm virtual hubs): HUB/CLUSTER ids, routing, one hub down.

Two real apiservers of the test control plane play two hubs, each with the upstream CRDs, the
ManagedCluster webhook and its own emulator. The plugin reaches hub "east" through a TCP proxy
the test can cut, as a hub that stops answering.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm import OcmOptions, OcmPlugin, parse_config
from plugins.ocm.config import ConfigError
from plugins.sdk.client import PluginCallError
from tests.plugins.ocm.conftest import NEW, OLD, StartPlugin, curator_config
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import OcmEmulator

SUCCEEDED, FAILED = cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED
TAINT_KEY = "fleetupgrade.io/service-out"


class Outage:
    """A TCP proxy in front of an apiserver; cut() drops every connection and refuses new
    ones (the hub is down), restore() serves again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self.restore()

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile: this pair goes too
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            conns, self._conns = self._conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _through(hub: KubeCluster, outage: Outage, directory: Path) -> Path:
    """A copy of the hub's kubeconfig that reaches it through the proxy."""
    config = yaml.safe_load(hub.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{outage.port}"
    path = directory / f"{hub.name}-proxied.kubeconfig"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def west(second_hub: KubeCluster) -> Iterator[OcmEmulator]:
    """The OCM agent emulator on the second hub."""
    emu = OcmEmulator(second_hub, upgrade_seconds=0.6).start()
    yield emu
    emu.stop()
    for name in emu.cluster_names():
        emu.remove_cluster(name)


@pytest.fixture
def east_outage(hub: KubeCluster) -> Iterator[Outage]:
    host, port = hub.url.removeprefix("https://").rsplit(":", 1)
    outage = Outage((host, int(port)))
    yield outage
    outage.cut()


def _two_hubs(
    hub: KubeCluster, second_hub: KubeCluster, outage: Outage, tmp_path: Path, **extra: Any
) -> dict[str, Any]:
    return curator_config(
        hubs=[
            {"name": "east", "kubeconfig": str(_through(hub, outage, tmp_path))},
            {"name": "west", "kubeconfig": str(second_hub.kubeconfig)},
        ],
        **extra,
    )


def test_clusters_of_two_hubs_are_hub_slash_cluster_and_every_call_goes_to_its_hub(
    hub: KubeCluster,
    second_hub: KubeCluster,
    emulator: OcmEmulator,
    west: OcmEmulator,
    east_outage: Outage,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    tmp_path: Path,
) -> None:
    shared, only_west = names(2)
    emulator.add_cluster(shared, OLD, labels={"tier": "gold"})
    west.add_cluster(shared, OLD, labels={"tier": "gold"})  # the same name on both hubs
    west.add_cluster(only_west, OLD)
    plugin = start_plugin(_two_hubs(hub, second_hub, east_outage, tmp_path))
    mine = {f"east/{shared}", f"west/{shared}", f"west/{only_west}"}
    listed = {c.id: c for c in plugin.client.list_clusters() if c.id in mine}
    assert set(listed) == mine
    gold = {c.id for c in plugin.client.list_clusters({"tier": "gold"}) if c.id in mine}
    assert gold == {f"east/{shared}", f"west/{shared}"}
    info = plugin.client.info()
    assert "east=" in info.manifest["hubs"] and "west=" in info.manifest["hubs"]

    out = plugin.end(plugin.client.service_out("out-east", f"east/{shared}").id)
    assert out.state == SUCCEEDED and out.cluster_id == f"east/{shared}"
    assert [t["key"] for t in emulator.taints_of(shared)] == [TAINT_KEY]
    assert west.taints_of(shared) == []  # the other hub's cluster of that name is untouched
    assert not plugin.client.get_cluster(f"east/{shared}").in_service
    assert plugin.client.get_cluster(f"west/{shared}").in_service

    up = plugin.client.upgrade_control_plane("up-west", f"west/{shared}", NEW)
    assert up.cluster_id == f"west/{shared}"
    assert plugin.end(up.id).state == SUCCEEDED
    assert west.curations_started == {shared: 1} and emulator.curations_started == {}
    assert plugin.client.get_cluster(f"west/{shared}").control_plane_version == NEW
    assert plugin.client.get_cluster(f"east/{shared}").control_plane_version == OLD

    for bad in (shared, f"north/{shared}", f"east/{shared}/x"):
        with pytest.raises(PluginCallError) as err:
            plugin.client.get_cluster(bad)
        assert err.value.code is grpc.StatusCode.NOT_FOUND
        assert "HUB/CLUSTER" in err.value.message and "east, west" in err.value.message
    plugin.end(plugin.client.service_in("in-east", f"east/{shared}").id)
    assert emulator.taints_of(shared) == []


def test_one_hub_down_marks_only_its_clusters_unavailable(
    hub: KubeCluster,
    second_hub: KubeCluster,
    emulator: OcmEmulator,
    west: OcmEmulator,
    east_outage: Outage,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    tmp_path: Path,
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    west.add_cluster(name, OLD)
    plugin = start_plugin(_two_hubs(hub, second_hub, east_outage, tmp_path))
    east_id, west_id = f"east/{name}", f"west/{name}"
    assert plugin.client.get_cluster(east_id).available

    east_outage.cut()
    down = wait_for(
        "east's clusters turn unavailable",
        lambda: not (c := plugin.client.get_cluster(east_id)).available and c,
        timeout=30,
    )
    assert down.unavailable_reason.startswith("hub east unreachable (")
    listed = {c.id: c for c in plugin.client.list_clusters() if c.id in (east_id, west_id)}
    assert not listed[east_id].available and listed[west_id].available
    with pytest.raises(PluginCallError) as err:
        plugin.client.preflight_upgrade(east_id, NEW)
    assert err.value.code is grpc.StatusCode.UNAVAILABLE, "preflight"
    with pytest.raises(PluginCallError) as err:
        plugin.client.service_out("out-east", east_id)
    assert err.value.code is grpc.StatusCode.UNAVAILABLE, "service-out"
    out = plugin.end(plugin.client.service_out("out-west", west_id).id)
    assert out.state == SUCCEEDED and west.taints_of(name)[0]["key"] == TAINT_KEY
    assert emulator.taints_of(name) == []
    ready, why = plugin.plugin.fleet.readiness()
    assert not ready and why.startswith("hub east: ")

    east_outage.restore()
    wait_for("east answers again", lambda: plugin.client.get_cluster(east_id).available, timeout=30)
    assert plugin.end(plugin.client.service_out("out-east", east_id).id).state == SUCCEEDED
    plugin.end(plugin.client.service_in("in-west", west_id).id)


def test_a_hub_never_listed_holds_the_inventory_back_and_says_which(
    hub: KubeCluster,
    second_hub: KubeCluster,
    emulator: OcmEmulator,
    west: OcmEmulator,
    east_outage: Outage,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    tmp_path: Path,
) -> None:
    [name] = names(1)
    west.add_cluster(name, OLD)
    config = _two_hubs(hub, second_hub, east_outage, tmp_path)
    east_outage.cut()
    plugin = start_plugin(config, sync_wait=0.5)
    with pytest.raises(PluginCallError) as err:
        plugin.client.list_clusters()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE and "hub east" in err.value.message
    # The other hub's clusters are served by id meanwhile.
    assert plugin.client.get_cluster(f"west/{name}").available
    east_outage.restore()
    wait_for(
        "east is listed",
        lambda: f"west/{name}" in {c.id for c in plugin.client.list_clusters()},
        timeout=30,
    )


@pytest.mark.parametrize(
    ("hubs", "problem"),
    [
        (
            [{"name": "east", "kubeconfig": "a"}, {"name": "east", "kubeconfig": "b"}],
            "hubs: hub names must be unique; ['east'] repeat",
        ),
        ([{"name": "East_1", "kubeconfig": "a"}], "hubs[0].name: 'East_1' is not a hub name"),
        ([{"name": "east"}], "hubs[0].kubeconfig: missing; this field is required"),
        ([{"name": "east", "kubeconfig": "a", "url": "x"}], "hubs[0].url: unknown field"),
    ],
)
def test_hub_configuration_errors_name_the_field(hubs: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(curator_config(hubs=hubs))
    assert problem in str(err.value)


def test_kubeconfig_and_hubs_together_are_refused(tmp_path: Path) -> None:
    config = parse_config(curator_config(hubs=[{"name": "east", "kubeconfig": "a"}]))
    with pytest.raises(ConfigError) as err:
        OcmPlugin(OcmOptions(config=config, kubeconfig=str(tmp_path / "kc")))
    assert str(err.value).startswith("--kubeconfig and the configuration's hubs both name hubs")


def test_a_single_hub_from_the_configuration_keeps_plain_ids(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    plugin = start_plugin(
        curator_config(hubs=[{"name": "only", "kubeconfig": str(hub.kubeconfig)}])
    )
    assert plugin.client.get_cluster(name).id == name
