"""fleet-plugin-sim as a real process: start, serve, metrics, SIGHUP reload, SIGTERM, bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.sim.support import wait_until

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "plugins" / "sim" / "examples"
ERRORS = (
    'sum(rate(http_requests_total{cluster="{{cluster}}",code=~"5.."}[5m])) / '
    'sum(rate(http_requests_total{cluster="{{cluster}}"}[5m]))'
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sim_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plugins.sim.server", *args]


def _logged(log: Path, message: str) -> dict[str, object] | None:
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == message:
            return dict(entry)
    return None


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path, int]]:
    """The sim on a copy of the small example fleet: (process, fleet file, log, metrics port)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLES / "small-fleet.yaml").read_text())
    log = tmp_path / "sim.log"
    metrics_port = _free_port()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            _sim_command(
                "--listen",
                "127.0.0.1:0",
                "--fleet",
                str(fleet),
                "--monitor-file",
                str(tmp_path / "monitor.json"),
                "--metrics-addr",
                f"127.0.0.1:{metrics_port}",
                "--admin-addr",
                "127.0.0.1:0",
                "--target-version",
                "1.29.4",
                "--step-seconds",
                "0.05",
                "--reload-interval",
                "0",
            ),
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        yield proc, fleet, log, metrics_port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_the_command_serves_the_fleet_reloads_on_sighup_and_stops_on_sigterm(
    sim_process: tuple[subprocess.Popen[bytes], Path, Path, int], tmp_path: Path
) -> None:
    proc, fleet, log, metrics_port = sim_process
    ready = wait_until(lambda: _logged(log, "simulated fleet ready"), 60, "the sim to start")
    assert ready["clusters"] == 12
    with PluginClient(str(ready["address"]), caller="cli-test") as client:
        clusters = client.list_clusters()
        assert len(clusters) == 12
        assert len(client.list_clusters({"stage": "canary"})) == 2
        assert client.query_metric(ERRORS, {}, "main-eu-1").value == pytest.approx(0.002)
        op = client.service_out("out-1", "early-us-1")
        wait_until(lambda: client.get_operation(op.id).state == 3, what="service-out to succeed")

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert "fleet_sim_clusters_total 12.0" in text.splitlines()
        assert "fleet_sim_clusters_at_target 0.0" in text.splitlines()

        data = yaml.safe_load(fleet.read_text())
        data["defaults"]["metrics"][ERRORS] = 0.4
        fleet.write_text(yaml.safe_dump(data))
        proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: client.query_metric(ERRORS, {}, "main-eu-1").value == pytest.approx(0.4),
            what="the reloaded metric",
        )
        assert not client.get_cluster("early-us-1").in_service  # state kept across reload

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    monitor = json.loads((tmp_path / "monitor.json").read_text())
    assert monitor["mutations_total"] == 1
    assert monitor["min_available_in_service"] == 11
    assert monitor["mutating_callers"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--generate", "0"], "--generate: must be at least 1"),
        (["--generate", "3", "--target-version", "next"], "--target-version: 'next' is not"),
        (["--fleet", "/nonexistent/fleet.yaml"], "--fleet: cannot read '/nonexistent/fleet.yaml'"),
        (["--generate", "3", "--tls-key", "k.pem"], "--tls-cert: required with --tls-key"),
        (
            ["--generate", "3", "--monitor-file", "/nonexistent/m.json"],
            "--monitor-file: cannot write '/nonexistent/m.json'",
        ),
        (["--generate", "3", "--admin-addr", "localhost"], "--admin-addr: 'localhost' is not"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    result = subprocess.run(
        _sim_command("--listen", "127.0.0.1:0", *args),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr


def test_a_bad_fleet_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    fleet = tmp_path / "bad.yaml"
    fleet.write_text(
        "clusters:\n"
        "  - {id: a, controlPlaneVersion: 1.28.5, nodePools: [{name: p, version: 1.29.0}]}\n"
    )
    result = subprocess.run(
        _sim_command("--listen", "127.0.0.1:0", "--fleet", str(fleet)),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert (
        f"{fleet}: clusters[0].nodePools[0].version: 1.29.0 is newer than controlPlaneVersion "
        "1.28.5; a node pool cannot be newer than its control plane"
    ) in result.stderr


def test_a_durable_sim_passes_the_kit_across_a_real_restart(tmp_path: Path) -> None:
    """--state-dir journals operations; the kit's --restart-command restarts the process."""
    port = _free_port()
    pidfile = tmp_path / "sim.pid"
    command = " ".join(
        _sim_command(
            "--listen",
            f"127.0.0.1:{port}",
            "--generate",
            "3",
            "--step-seconds",
            "0.05",
            "--state-dir",
            str(tmp_path / "state"),
        )
    )
    log = tmp_path / "sim.log"
    start = f"cd {REPO} && PYTHONPATH={REPO} {command} >>{log} 2>&1 & echo $! >{pidfile}"
    restart = tmp_path / "restart.sh"
    restart.write_text(
        "set -e\n"
        f'pid=$(cat {pidfile}); kill -TERM "$pid"\n'
        f'while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done\n'
        f"{start}\n"
    )
    subprocess.run(["sh", "-c", start], check=True, timeout=30)
    try:
        with PluginClient(f"127.0.0.1:{port}") as client:
            wait_until(lambda: _ready(client), timeout=30, what="the sim to serve")
        kit = subprocess.run(
            [
                sys.executable,
                "-m",
                "plugins.sdk.conformance",
                "--endpoint",
                f"127.0.0.1:{port}",
                "--restart-command",
                f"sh {restart}",
                "--timeout",
                "30",
                "--",
                "-v",
                "-k",
                "survive or preflight",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert kit.returncode == 0, kit.stdout[-3000:]
        assert "test_operations_and_request_ids_survive_a_restart PASSED" in kit.stdout
        assert "test_preflight_changes_nothing PASSED" in kit.stdout
        assert "conformance notes" not in kit.stdout  # the restart really ran
        assert (tmp_path / "state" / "operations.jsonl").stat().st_size > 0
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)


def _ready(client: PluginClient) -> bool:
    try:
        return client.probe().ready
    except PluginCallError:
        return False
