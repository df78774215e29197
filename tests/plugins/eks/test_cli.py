"""fleet-plugin-eks as a real process: credentials through IRSA (a web identity token and a
role, exchanged with STS by boto3's default chain), no secret in its log even with --debug,
SIGTERM, and clear errors for a bad configuration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from plugins.sdk.client import PluginClient
from tests.plugins.eks.conftest import NAMES
from tests.plugins.eks.support import cluster_id, plugin_config
from tests.support.eks_emulator import ACCOUNT, EksEmulator
from tests.support.eks_emulator.sts import StsEmulator
from tests.support.plugin_harness import wait_until

REPO = Path(__file__).resolve().parents[3]
ROLE = f"arn:aws:iam::{ACCOUNT}:role/fleet-upgrade-eks"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.irsa-web-identity-token-never-logged.c2lnbmF0dXJl"


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plugins.eks", *args]


def _logged(log: Path, message: str) -> dict[str, object] | None:
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == message:
            return dict(entry)
    return None


def _irsa_environment(tmp_path: Path, sts: StsEmulator) -> dict[str, str]:
    """What EKS's pod identity webhook gives a pod (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE),
    STS pointed at the emulator, and nothing else of AWS (no keys, no profile)."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {
        **env,
        "PYTHONPATH": str(REPO),
        "AWS_ROLE_ARN": ROLE,
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
        "AWS_ENDPOINT_URL_STS": sts.endpoint,
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture
def sts() -> Iterator[StsEmulator]:
    with StsEmulator() as emu:
        yield emu


def test_the_command_serves_with_irsa_credentials_and_logs_no_secret(
    emulator: EksEmulator, sts: StsEmulator, tmp_path: Path
) -> None:
    config_file = tmp_path / "eks.yaml"
    config_file.write_text(yaml.safe_dump(plugin_config(emulator)))
    log = tmp_path / "plugin.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            _command("--listen", "127.0.0.1:0", "--config", str(config_file), "--debug"),
            cwd=REPO,
            env=_irsa_environment(tmp_path, sts),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        ready = wait_until(lambda: _logged(log, "EKS plugin ready"), 30, "plugin ready")
        with PluginClient(str(ready["address"])) as client:
            assert client.info().name == "eks.fleetupgrade.io"
            assert client.probe().ready
            assert [c.id for c in client.list_clusters()] == [cluster_id(n) for n in NAMES]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    # boto3 exchanged the pod's token for the role's session credentials, and EKS saw only
    # requests signed with them.
    assert sts.assumed and sts.assumed[0]["RoleArn"] == ROLE
    assert sts.assumed[0]["WebIdentityToken"] == TOKEN
    assert emulator.access_keys() == {c["AccessKeyId"] for c in sts.issued}
    text = log.read_text()
    assert "rpc ClusterService/ListClusters" in text  # --debug logged the RPCs
    assert TOKEN not in text
    for issued in sts.issued:
        assert issued["SecretAccessKey"] not in text and issued["SessionToken"] not in text


def test_a_bad_configuration_exits_2_naming_the_fields(tmp_path: Path) -> None:
    config = tmp_path / "eks.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "account": 123,
                "regions": ["us-east-1", "mars"],
                "clusters": {"names": ["bad name"]},
                "traffic": {"mode": "route53"},
                "api": {"endpoint": "http://example.com"},
                "surprise": 1,
            }
        )
    )
    done = subprocess.run(
        _command("--config", str(config)),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "account:" in err
    assert "regions[1] 'mars' is not an AWS region" in err
    assert "clusters.names[0] 'bad name'" in err
    assert "traffic.route53: is required with mode route53" in err
    assert "api.endpoint: must be an https:// URL" in err
    assert "surprise: unknown field" in err
