"""Fixtures of the GKE plugin tests: a GKE API emulator with four clusters, a plugin factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.plugins.gke.support import FAST, plugin_config, populate, running_plugin
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import RunningPlugin

NAMES = ["c1", "c2", "c3", "c4"]

StartPlugin = Callable[..., RunningPlugin]


@pytest.fixture
def emulator() -> Iterator[GkeEmulator]:
    """The emulator with c1..c4 at OLD (two pools each) and backend service "web"."""
    # Blue-green soaks (the workers pool: 60 s) run 100 times faster than GKE waits.
    with GkeEmulator(
        master_seconds=FAST, nodes_seconds=FAST, compute_op_seconds=0.2, soak_scale=0.01
    ) as emu:
        populate(emu, NAMES)
        yield emu


@pytest.fixture
def start_plugin(emulator: GkeEmulator) -> Iterator[StartPlugin]:
    """start_plugin(config=None, **plugin_config_options) -> RunningPlugin, stopped after."""
    with ExitStack() as stack:

        def start(config: dict[str, Any] | None = None, **options: Any) -> RunningPlugin:
            data = config if config is not None else plugin_config(emulator, NAMES, **options)
            return stack.enter_context(running_plugin(data))

        yield start
