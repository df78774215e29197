"""fleet-plugin-gke as a real process: Application Default Credentials, no secrets in its log,
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
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from plugins.sdk.client import PluginClient
from tests.plugins.gke.conftest import NAMES
from tests.plugins.gke.support import cluster_id, plugin_config
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_until

REPO = Path(__file__).resolve().parents[3]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plugins.gke", *args]


def _logged(log: Path, message: str) -> dict[str, object] | None:
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == message:
            return dict(entry)
    return None


def _service_account_key(path: Path) -> str:
    """A service-account key file (a fresh RSA key); returns the private key PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "0123456789abcdef",
                "private_key": pem,
                "client_email": "fleet-upgrade@p.iam.gserviceaccount.com",
                "client_id": "100000000000000000001",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    return pem


@pytest.fixture
def plugin_process(
    emulator: GkeEmulator, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    """The plugin with ADC from a service-account key file: (process, log, private key PEM)."""
    key_file = tmp_path / "key.json"
    pem = _service_account_key(key_file)
    config = plugin_config(emulator, NAMES)
    config["api"]["credentials"] = "default"
    config_file = tmp_path / "gke.yaml"
    config_file.write_text(yaml.safe_dump(config))
    log = tmp_path / "plugin.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GOOGLE_APPLICATION_CREDENTIALS": str(key_file)}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            _command("--listen", "127.0.0.1:0", "--config", str(config_file), "--debug"),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        yield proc, log, pem
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_the_command_serves_with_adc_and_logs_no_secret(
    emulator: GkeEmulator, plugin_process: tuple[subprocess.Popen[bytes], Path, str]
) -> None:
    proc, log, pem = plugin_process
    ready = wait_until(lambda: _logged(log, "GKE plugin ready"), 30, "plugin ready")
    address = str(ready["address"])
    with PluginClient(address) as client:
        assert client.info().name == "gke.fleetupgrade.io"
        assert client.probe().ready
        listed = [c.id for c in client.list_clusters()]
        assert listed == [cluster_id(n) for n in NAMES]
    bearer = [a for a in emulator.authorizations() if a]
    assert bearer and all(a.startswith("Bearer ") for a in bearer)
    assert len(bearer) == len(emulator.authorizations())  # every call was authenticated
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    text = log.read_text()
    assert "Application Default Credentials" in text
    body = "".join(pem.splitlines()[1:-1])
    for secret in {a.removeprefix("Bearer ") for a in bearer}:
        assert secret not in text
    assert body[:40] not in text and "PRIVATE KEY" not in text


def test_a_bad_configuration_exits_2_naming_the_fields(tmp_path: Path) -> None:
    config = tmp_path / "gke.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "clusters": {"ids": ["projects/p/clusters/c1"]},
                "traffic": {"mode": "backendServices"},
                "api": {"credentials": "anonymous"},
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
    assert "clusters.ids[0]" in err and "projects/PROJECT/locations/LOCATION" in err
    assert "traffic.backendServices" in err
    assert "api.credentials: anonymous is only allowed" in err
    assert "surprise: unknown field" in err
