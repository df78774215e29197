"""fleet-plugin-aks as a real process: workload identity through azure-identity unchanged (the
emulator plays Entra ID's token endpoint), no secret in its log, SIGTERM, and clear errors for a
bad configuration or a missing workload identity environment."""

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
from tests.plugins.aks.conftest import NAMES
from tests.plugins.aks.support import cluster_id, plugin_config
from tests.support.aks_emulator import AksEmulator
from tests.support.plugin_harness import wait_until

REPO = Path(__file__).resolve().parents[3]
_WORKLOAD_ENV = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE")


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plugins.aks", *args]


def _logged(log: Path, message: str) -> dict[str, object] | None:
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == message:
            return dict(entry)
    return None


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture
def plugin_process(
    emulator: AksEmulator, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The plugin with workload identity as the AKS webhook would set it up."""
    token_file = tmp_path / "azure-identity-token"
    token_file.write_text(emulator.federated_token)
    config = plugin_config(emulator, NAMES)
    config["api"].update({"credentials": "workloadIdentity", "disableInstanceDiscovery": True})
    config_file = tmp_path / "aks.yaml"
    config_file.write_text(yaml.safe_dump(config))
    log = tmp_path / "plugin.log"
    env = {
        **_clean_env(),
        "AZURE_CLIENT_ID": emulator.client_id,
        "AZURE_TENANT_ID": emulator.tenant_id,
        "AZURE_FEDERATED_TOKEN_FILE": str(token_file),
        "AZURE_AUTHORITY_HOST": emulator.endpoint,
        "REQUESTS_CA_BUNDLE": emulator.ca_file,  # MSAL's token requests trust the emulator
    }
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            _command("--listen", "127.0.0.1:0", "--config", str(config_file), "--debug"),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_the_command_serves_with_workload_identity_and_logs_no_secret(
    emulator: AksEmulator, plugin_process: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, log = plugin_process
    ready = wait_until(lambda: _logged(log, "AKS plugin ready"), 30, "plugin ready")
    with PluginClient(str(ready["address"])) as client:
        assert client.info().name == "aks.fleetupgrade.io"
        assert client.probe().ready
        assert [c.id for c in client.list_clusters()] == [cluster_id(n) for n in NAMES]
    # The token came from the federated credential exchange, for this client.
    requests = emulator.server.token_requests
    assert requests and requests[0]["client_id"] == emulator.client_id
    assert requests[0]["grant_type"] == "client_credentials"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    text = log.read_text()
    assert emulator.token not in text
    assert emulator.federated_token not in text


def test_a_bad_configuration_exits_2_naming_the_fields(tmp_path: Path) -> None:
    config = tmp_path / "aks.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "clusters": {"ids": ["/subscriptions/s/managedClusters/c1"]},
                "api": {"endpoint": "http://management.azure.com", "clientSecret": "hunter2"},
            }
        )
    )
    done = subprocess.run(
        _command("--config", str(config)),
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "clusters.ids[0]" in err and "managedClusters/NAME" in err
    assert "api.endpoint: must be an https:// URL" in err
    assert "api.clientSecret: unknown field" in err
    assert "hunter2" not in err


def test_workload_identity_without_its_environment_exits_2_saying_what_is_missing(
    emulator: AksEmulator, tmp_path: Path
) -> None:
    config = tmp_path / "aks.yaml"
    config.write_text(yaml.safe_dump(plugin_config(emulator, NAMES)))
    done = subprocess.run(
        _command("--config", str(config)),
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert all(name in done.stderr.decode() for name in _WORKLOAD_ENV)
