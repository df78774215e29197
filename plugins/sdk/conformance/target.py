"""What the conformance suite runs against: the endpoint, TLS, cluster and time limits."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from plugins.sdk.client import ClientTLS

__all__ = ["TARGET_KEY", "ConformanceTarget", "TargetPlugin"]

TARGET_KEY = pytest.StashKey["ConformanceTarget"]()
"""Where run_conformance leaves the target in the pytest config for the suite's fixtures."""

_ENV_PREFIX = "FLEET_CONFORMANCE_"


@dataclass(frozen=True)
class ConformanceTarget:
    """A plugin endpoint to check; cluster None means the first listed cluster."""

    endpoint: str
    tls: ClientTLS | None = None
    cluster: str | None = None
    timeout: float = 120.0  # seconds an operation may take to reach a terminal state

    @classmethod
    def from_env(cls) -> ConformanceTarget | None:
        """The target from FLEET_CONFORMANCE_* variables (for running the suite with pytest)."""
        env = {k[len(_ENV_PREFIX) :]: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)}
        endpoint = env.get("ENDPOINT", "")
        if not endpoint:
            return None
        ca, cert, key = env.get("TLS_CA"), env.get("TLS_CERT"), env.get("TLS_KEY")
        tls = ClientTLS(ca_file=ca, cert_file=cert, key_file=key) if ca or cert or key else None
        return cls(
            endpoint=endpoint,
            tls=tls,
            cluster=env.get("CLUSTER") or None,
            timeout=float(env.get("TIMEOUT") or 120.0),
        )


class TargetPlugin:
    """A pytest plugin object that hands the target to the suite."""

    def __init__(self, target: ConformanceTarget) -> None:
        self.target = target

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[TARGET_KEY] = self.target
