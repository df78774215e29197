"""Fixtures of the AKS plugin tests: an AKS emulator with four clusters, a plugin factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.plugins.aks.support import FAST, plugin_config, populate, running_plugin
from tests.support.aks_emulator import AksEmulator
from tests.support.plugin_harness import RunningPlugin

NAMES = ["c1", "c2", "c3", "c4"]

StartPlugin = Callable[..., RunningPlugin]


@pytest.fixture
def emulator() -> Iterator[AksEmulator]:
    """The emulator with c1..c4 at OLD (pools system and user)."""
    with AksEmulator(op_seconds=FAST) as emu:
        populate(emu, NAMES)
        yield emu


@pytest.fixture
def start_plugin(emulator: AksEmulator) -> Iterator[StartPlugin]:
    """start_plugin(config=None, **plugin_config_options) -> RunningPlugin, stopped after."""
    with ExitStack() as stack:

        def start(config: dict[str, Any] | None = None, **options: Any) -> RunningPlugin:
            data = config if config is not None else plugin_config(emulator, NAMES, **options)
            return stack.enter_context(running_plugin(emulator, data))

        yield start
