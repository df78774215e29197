"""fleet-plugin-legacy as a real process: serve, Probe, metrics, SIGKILL and restart with --state
(same request id, same operation, one upstream call), SIGTERM, and bad input (exit 2)."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from tests.plugins.legacy.conftest import COMMAND, IDS, NEW, OLD, bridge_process
from tests.support.kube import wait_for
from tests.support.legacy_server import UPGRADE_MASTER, LegacyServer
from tests.support.orchestrator import ROOT, free_port


def _seed_manifest(path: Path) -> None:
    """The original operator's ClusterVersion, as its users have it."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "multicluster-ops.io/v1",
                "kind": "ClusterVersion",
                "metadata": {"name": "fleet"},
                "spec": {
                    "requiredAvailableCount": 1,
                    "opsEndpoint": {"endpoint": "legacy-plugin:8080", "insecure": True},
                    "clusters": [{"id": cid, "version": NEW} for cid in IDS[:3]],
                },
            }
        )
    )


def test_the_command_serves_survives_sigkill_with_its_state_and_stops_on_sigterm(
    upstream: LegacyServer, tmp_path: Path
) -> None:
    manifest, state, log = tmp_path / "cv.yaml", tmp_path / "legacy.json", tmp_path / "bridge.log"
    _seed_manifest(manifest)
    upstream.model.ticks_per_operation = 10_000  # the upgrade runs until the test ends it
    metrics = free_port()
    args = [
        "--upstream",
        upstream.address,
        "--upstream-insecure",
        "--clusters-file",
        str(manifest),
        "--cluster",
        IDS[3],
        "--state",
        str(state),
        "--poll-interval",
        "0.1",
    ]
    with bridge_process([*args, "--metrics-addr", f"127.0.0.1:{metrics}"], log) as (proc, client):
        info = client.info()
        assert info.name == "legacy.fleetupgrade.io"
        assert info.manifest["upstream"] == upstream.address
        assert info.manifest["clusters"] == "4" and info.manifest["durable"] == "true"
        caps = client.capabilities()
        assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS in caps
        assert identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE not in caps
        assert [c.id for c in client.list_clusters()] == sorted(IDS)
        first = client.upgrade_control_plane("cli-1", IDS[0], NEW)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as page:
            text = page.read().decode()
        assert "fleet_plugin_rpc_total{" in text
        assert 'fleet_legacy_upstream_calls_total{code="OK",rpc="UpgradeMaster"} 1.0' in text
        assert 'fleet_legacy_upstream_calls_total{code="OK",rpc="GetVersion"}' in text
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    with bridge_process(args, log) as (proc, client):
        again = client.upgrade_control_plane("cli-1", IDS[0], NEW)
        assert again.id == first.id
        with upstream.model.lock:
            for op in upstream.model.operations.values():
                op.ticks_left = 1
        done = wait_for(
            "the upgrade ends",
            lambda: (
                (op := client.get_operation(first.id)).state
                == cluster_pb2.OPERATION_STATE_SUCCEEDED
                and op
            ),
            timeout=15,
        )
        assert done.target_version == NEW
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert upstream.model.count(UPGRADE_MASTER) == 1
    assert upstream.model.snapshot(IDS[0]).master == NEW
    assert upstream.model.snapshot(IDS[1]).master == OLD


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "pass --cluster ID (repeatable) or --clusters-file FILE"),
        (["--cluster", "c1", "--upstream-ca", "/nowhere/ca.pem"], "--upstream-insecure:"),
        (["--clusters-file", "/nowhere/clusters.yaml"], "--clusters-file: cannot read"),
        (["--cluster", "c1", "--state", "STATE"], "is not an operation journal record"),
        (["--cluster", "c1", "--state", "FILE/legacy.json"], "--state: cannot use"),
        (["--cluster", "c1", "--poll-interval", "0"], "--poll-interval: must be positive"),
    ],
    ids=["no-clusters", "insecure-with-ca", "clusters-file", "foreign-state", "state-dir", "poll"],
)
def test_bad_input_exits_2_naming_the_flag(tmp_path: Path, extra: list[str], message: str) -> None:
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"pb": "not an operation"}\n{}\n')
    argv = [a.replace("STATE", str(foreign)).replace("FILE", str(foreign)) for a in extra]
    result = subprocess.run(
        [
            *COMMAND,
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:1",
            "--upstream-insecure",
            *argv,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
