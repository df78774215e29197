"""Issue 24 item 1 (the read side): a run that cannot reach its plugin says why where people look.

The real `fleet-orchestrator run` against the local apiserver: a FleetProvider pointing at a port
nothing listens on, and a TLS plugin (the sim, with a certificate for 127.0.0.1 and localhost)
reached under a server name its certificate does not hold. `fleet-orchestrator status` leads with
the cause and the fix instead of "Pending / run starting", `kubectl get cv -o wide` shows it in
DEGRADED and MESSAGE, and `wait` ends on the timeout naming it.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import api
from orchestrator.cli import main
from plugins.sdk.server import ServerTLS
from plugins.sim.server import SimOptions, Simulator
from tests.e2e.conftest import NEW, Objects, Orchestrators, cluster_version, fleet_file, ids
from tests.e2e.test_provider_identity import fleet_provider
from tests.operate.test_cli import _table
from tests.support.certs import TestPKI, generate_pki
from tests.support.kube import KubeCluster, wait_for


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(
    control_plane: KubeCluster, ns: str, name: str, capsys: pytest.CaptureFixture[str]
) -> str:
    code = main(["status", name, "--kubeconfig", str(control_plane.kubeconfig), "-n", ns])
    out, _ = capsys.readouterr()
    assert code == 0
    return out


def _degraded(objects: Objects, name: str) -> dict[str, Any] | None:
    status = objects.cv_status(name)
    found = [c for c in status.get("conditions") or [] if c["type"] == "Degraded"]
    return status if found and found[0]["status"] == "True" else None


def test_an_unreachable_plugin_is_the_first_thing_status_says(
    control_plane: KubeCluster,
    objects: Objects,
    orchestrators: Orchestrators,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = _closed_port()
    with fleet_provider(objects, f"gone-{objects.ns}"[:63], f"127.0.0.1:{port}", objects.ns) as fp:
        body = cluster_version("prod", "unused:1", ids(2), 1)
        del body["spec"]["opsEndpoint"]  # type: ignore[index]
        body["spec"]["providerRef"] = {"name": fp}  # type: ignore[index]
        orchestrators.start()
        objects.create_cv(body)
        status = wait_for(
            "the ClusterVersion Degraded", lambda: _degraded(objects, "prod"), timeout=60
        )
        # The cause first, the gRPC code once, then the fix (issue 24).
        words = (
            f"plugin 127.0.0.1:{port}: unreachable (UNAVAILABLE); check that the plugin runs and "
            "listens at this address (the FleetProvider's spec.endpoint, or "
            "spec.opsEndpoint.endpoint)"
        )
        assert status["phase"] == "Pending"
        assert status["message"] == f"cannot progress: PluginUnavailable: {words}"
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["message"] == words
        out = _status(control_plane, objects.ns, "prod", capsys)
        lines = out.splitlines()
        assert lines[0] == f"ClusterVersion {objects.ns}/prod: Pending"
        assert lines[1] == f"  Cannot progress: PluginUnavailable: {words}"
        # The message carries its fix: no second one.
        assert not lines[2].startswith("  Fix:")
        assert "run starting" not in out
        row = _table(control_plane, objects.ns, api.PLURAL)["prod"]
        assert (row["Phase"], row["Degraded"]) == ("Pending", "PluginUnavailable")
        assert row["Message"] == f"cannot progress: PluginUnavailable: {words}"
        run = _table(control_plane, objects.ns, api.UPDATE_RUN_PLURAL)[status["currentRun"]]
        assert run["Degraded"] == "PluginUnavailable"
        # `wait` ends on its timeout with the cause (exit 124).
        code = main(
            [
                *("wait", "prod", "--kubeconfig", str(control_plane.kubeconfig)),
                *("-n", objects.ns, "--timeout", "1s", "--interval", "0.2"),
            ]
        )
        _, err = capsys.readouterr()
        assert code == 124
        assert f"cannot progress: PluginUnavailable: {words}" in err


@pytest.fixture
def tls_sim(tmp_path: Path) -> Iterator[tuple[Simulator, TestPKI]]:
    pki = generate_pki(tmp_path / "pki")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(fleet_file(2)))
    sim = Simulator(
        SimOptions(
            fleet_file=str(fleet),
            monitor_file=str(tmp_path / "monitor.json"),
            target_version=NEW,
            seed=11,
            reload_interval=0,
            tls=ServerTLS(pki.server.cert_file, pki.server.key_file),
        )
    )
    try:
        yield sim, pki
    finally:
        sim.stop()


def test_a_tls_name_mismatch_is_named_with_its_fix(
    control_plane: KubeCluster,
    objects: Objects,
    orchestrators: Orchestrators,
    tls_sim: tuple[Simulator, TestPKI],
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim, pki = tls_sim
    objects.core.create_namespaced_secret(
        objects.ns,
        {
            "metadata": {"name": "plugin-ca"},
            "data": {"ca.crt": base64.b64encode(pki.ca_pem).decode()},
        },
    )
    body = cluster_version("prod", sim.address, ids(2), 1)
    body["spec"]["opsEndpoint"] = {  # type: ignore[index]
        "endpoint": sim.address,
        "tls": {
            "caSecretRef": {"name": "plugin-ca", "key": "ca.crt"},
            "serverName": "elsewhere.example",
        },
    }
    orchestrators.start()
    objects.create_cv(body)
    wait_for("the ClusterVersion Degraded", lambda: _degraded(objects, "prod"), timeout=60)
    out = _status(control_plane, objects.ns, "prod", capsys)
    lines = out.splitlines()
    assert lines[1] == (
        f"  Cannot progress: PluginUnavailable: plugin {sim.address}: TLS "
        "verification failed (UNAVAILABLE); the plugin's certificate is not signed by the "
        "configured CA, or not for its name"
    )
    # The message carries its fix: no second one.
    assert not lines[2].startswith("  Fix:")
    assert _table(control_plane, objects.ns, api.PLURAL)["prod"]["Degraded"] == "PluginUnavailable"
