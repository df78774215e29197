"""Runs the conformance suite with pytest.main against one endpoint and returns the exit code."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from plugins.sdk.client import ClientTLS
from plugins.sdk.conformance.target import ConformanceTarget, TargetPlugin

__all__ = ["SUITE_DIR", "run_conformance"]

SUITE_DIR = Path(__file__).resolve().parent / "suite"
"""The directory of the suite's test modules."""

# The suite runs under its own empty configuration, never the caller's project settings.
_INI = "[pytest]\nconsole_output_style = classic\n"


def run_conformance(
    endpoint: str,
    tls: ClientTLS | None = None,
    cluster: str | None = None,
    *,
    timeout: float = 120.0,
    pytest_args: Sequence[str] = (),
    restart: Callable[[], None] | None = None,
) -> int:
    """Checks the plugin at endpoint against the contract; 0 when every check passed.

    cluster names the cluster the mutating checks use (default: the first listed one); they
    only make changes that the kit undoes (service-out then service-in) or that have nothing
    to do (an upgrade to the current version). timeout bounds each operation's run time.
    pytest_args are passed on (e.g. ["-k", "inventory", "-v"]). restart restarts the plugin
    on the same endpoint, for the durability checks (without it they check what they can
    without a restart).
    """
    if not endpoint:
        raise ValueError("endpoint: must not be empty; pass the plugin's HOST:PORT")
    if timeout <= 0:
        raise ValueError("timeout: must be positive seconds")
    target = ConformanceTarget(
        endpoint=endpoint, tls=tls, cluster=cluster, timeout=timeout, restart=restart
    )
    with tempfile.TemporaryDirectory(prefix="fleet-conformance-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text(_INI)
        args = [
            str(SUITE_DIR),
            "-c",
            str(ini),
            "--rootdir",
            str(SUITE_DIR),
            "-p",
            "no:cacheprovider",
            "-rfEs",
            *pytest_args,
        ]
        return int(pytest.main(args, plugins=[TargetPlugin(target)]))
