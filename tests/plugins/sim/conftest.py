"""Fixtures of the sim tests: start_sim starts simulators on loopback and stops them after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sim import SimOptions, Simulator, parse_fleet
from tests.plugins.sim.support import RunningSim

StartSim = Callable[..., RunningSim]


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[StartSim]:
    """start_sim(fleet_data=None, *, write_file=False, caller=..., client_tls=None, **options).

    fleet_data is a fleet file as a dict; with write_file it is written to a YAML file and
    passed as fleet_file (so reloads can be tested). options go to SimOptions.
    """
    running: list[RunningSim] = []

    def start(
        fleet_data: dict[str, Any] | None = None,
        *,
        write_file: bool = False,
        caller: str = "tests",
        client_tls: ClientTLS | None = None,
        **options: Any,
    ) -> RunningSim:
        index = len(running)
        monitor_file = tmp_path / f"monitor-{index}.json"
        options.setdefault("monitor_file", str(monitor_file))
        options.setdefault("admin_addr", "127.0.0.1:0")
        options.setdefault("seed", 1)
        if fleet_data is not None:
            if write_file:
                path = tmp_path / f"fleet-{index}.yaml"
                path.write_text(yaml.safe_dump(fleet_data))
                options["fleet_file"] = str(path)
            else:
                options["config"] = parse_fleet(fleet_data)
        registry = CollectorRegistry()
        sim = Simulator(SimOptions(registry=registry, **options))
        client = PluginClient(sim.address, caller=caller, tls=client_tls, plugin_name="sim")
        handle = RunningSim(sim, client, registry, Path(options["monitor_file"] or monitor_file))
        running.append(handle)
        return handle

    yield start
    for handle in reversed(running):
        handle.client.close()
        handle.sim.stop(grace=0)
