"""What the conformance suite runs against: the endpoint, TLS, cluster and time limits."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from plugins.sdk.client import ClientTLS

__all__ = ["NOTES_KEY", "TARGET_KEY", "ConformanceTarget", "TargetPlugin", "restart_command"]

TARGET_KEY = pytest.StashKey["ConformanceTarget"]()
"""Where run_conformance leaves the target in the pytest config for the suite's fixtures."""

NOTES_KEY = pytest.StashKey[list[str]]()
"""Notes the checks leave for the run's summary (what they could not check, and why)."""

_ENV_PREFIX = "FLEET_CONFORMANCE_"


@dataclass(frozen=True)
class ConformanceTarget:
    """A plugin endpoint to check; cluster None means the first listed cluster.

    restart, when given, restarts the plugin (same endpoint) and returns once the restart
    was requested; the kit then waits until Probe answers ready. The durability checks of a
    plugin declaring PLUGIN_CAPABILITY_DURABLE_OPERATIONS use it.
    """

    endpoint: str
    tls: ClientTLS | None = None
    cluster: str | None = None
    timeout: float = 120.0  # seconds an operation may take to reach a terminal state
    restart: Callable[[], None] | None = None

    @classmethod
    def from_env(cls) -> ConformanceTarget | None:
        """The target from FLEET_CONFORMANCE_* variables (for running the suite with pytest)."""
        env = {k[len(_ENV_PREFIX) :]: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)}
        endpoint = env.get("ENDPOINT", "")
        if not endpoint:
            return None
        ca, cert, key = env.get("TLS_CA"), env.get("TLS_CERT"), env.get("TLS_KEY")
        tls = ClientTLS(ca_file=ca, cert_file=cert, key_file=key) if ca or cert or key else None
        command = env.get("RESTART_COMMAND", "")
        return cls(
            endpoint=endpoint,
            tls=tls,
            cluster=env.get("CLUSTER") or None,
            timeout=float(env.get("TIMEOUT") or 120.0),
            restart=restart_command(command) if command else None,
        )


def restart_command(command: str, timeout: float = 300.0) -> Callable[[], None]:
    """A restart hook running a shell command (e.g. "kubectl rollout restart deploy/x");
    a non-zero exit fails the check that asked for the restart."""

    def restart() -> None:
        result = subprocess.run(
            command, shell=True, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"restart command {shlex.quote(command)} exited {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()[-500:]}"
            )

    return restart


class TargetPlugin:
    """A pytest plugin object that hands the target to the suite."""

    def __init__(self, target: ConformanceTarget) -> None:
        self.target = target

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[TARGET_KEY] = self.target
        config.stash[NOTES_KEY] = []

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        notes = config.stash.get(NOTES_KEY, [])
        if notes:
            terminalreporter.section("conformance notes")
            for note in notes:
                terminalreporter.write_line(note)
