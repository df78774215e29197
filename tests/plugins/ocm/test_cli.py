"""fleet-plugin-ocm as a real process: serve the hub, Probe, metrics, SIGTERM, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.ocm.conftest import OLD, curator_config
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import OcmEmulator
from tests.support.orchestrator import ROOT, free_port

COMMAND = [str(Path(sys.executable).parent / "fleet-plugin-ocm")]  # the console script


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def _ready(client: PluginClient) -> bool:
    """Probe, counting a plugin that is not listening yet (slow start under load) as not ready."""
    try:
        return client.probe().ready
    except PluginCallError:
        return False


def test_the_command_serves_the_hub_and_stops_on_sigterm(
    hub: KubeCluster,
    emulator: OcmEmulator,
    names: Callable[[int], list[str]],
    tmp_path: Path,
) -> None:
    ids = names(2)
    for name in ids:
        emulator.add_cluster(name, OLD)
    config = tmp_path / "ocm.yaml"
    config.write_text(yaml.safe_dump(curator_config()))
    port, metrics = free_port(), free_port()
    log = tmp_path / "plugin.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *COMMAND,
                "--listen",
                f"127.0.0.1:{port}",
                "--kubeconfig",
                str(hub.kubeconfig),
                "--config",
                str(config),
                "--metrics-addr",
                f"127.0.0.1:{metrics}",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with PluginClient(f"127.0.0.1:{port}") as client:
            try:
                wait_for("ready", lambda: _ready(client), timeout=30, interval=0.2)
            except TimeoutError:
                pytest.fail(f"not ready: {client.probe().message}\n{log.read_text()[-3000:]}")
            assert client.info().name == "ocm.fleetupgrade.io"
            assert client.info().manifest["upgradeMethod"] == "ClusterCurator"
            assert set(ids) <= {c.id for c in client.list_clusters()}
        url = f"http://127.0.0.1:{metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as page:
            assert "fleet_plugin_rpc_total{" in page.read().decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("msg") == "OCM plugin ready" for line in lines), lines[:5]
    token = yaml.safe_load(hub.kubeconfig.read_text())["users"][0]["user"]["token"]
    assert token not in log.read_text()  # never a credential in the logs


def test_a_bad_config_exits_2_naming_the_field(tmp_path: Path, hub: KubeCluster) -> None:
    config = tmp_path / "ocm.yaml"
    config.write_text(yaml.safe_dump({"upgradeMethod": "ClusterCurator", "monitorTimeout": "soon"}))
    result = _run(["--config", str(config), "--kubeconfig", str(hub.kubeconfig)])
    assert result.returncode == 2
    assert result.stderr.startswith(f"fleet-plugin-ocm: {config}: monitorTimeout: 'soon'")


def test_python_m_runs_the_same_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "plugins.ocm", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and "fleet-plugin-ocm" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--config"),
        (["--config", "/nonexistent/ocm.yaml"], "--config: cannot read"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    result = _run(args)
    assert result.returncode == 2
    assert message in result.stderr


def test_an_unreadable_kubeconfig_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "ocm.yaml"
    config.write_text(yaml.safe_dump(curator_config()))
    result = _run(["--config", str(config), "--kubeconfig", str(tmp_path / "absent")])
    assert result.returncode == 2
    assert "--kubeconfig: cannot load the hub's kubeconfig" in result.stderr
