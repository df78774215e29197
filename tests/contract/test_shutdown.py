"""Graceful shutdown of a real plugin process on SIGTERM / SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.sdk.client import PluginCallError, PluginClient

REPO = Path(__file__).resolve().parents[2]


class _Plugin:
    """The echo plugin running as a child process."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.echo_plugin", "--listen", "127.0.0.1:0", *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout=30)
        assert line and line[0].strip(), "the plugin did not print its address"
        self.address = line[0].strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)


@pytest.fixture
def plugin_factory() -> Iterator[type[_Plugin]]:
    started: list[_Plugin] = []

    class Tracked(_Plugin):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for plugin in started:
        plugin.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_plugin_cleanly_within_grace(
    plugin_factory: type[_Plugin], signum: signal.Signals
) -> None:
    plugin = plugin_factory("--grace", "5")
    with PluginClient(plugin.address) as client:
        assert client.probe().ready
    started = time.monotonic()
    plugin.process.send_signal(signum)
    _, stderr = plugin.process.communicate(timeout=15)
    assert plugin.process.returncode == 0, stderr
    assert time.monotonic() - started < 5.0 + 2.0
    messages = [json.loads(line)["msg"] for line in stderr.splitlines() if line.startswith("{")]
    assert messages[-2:] == ["shutting down", "stopped"]


def test_open_watch_streams_end_cleanly_without_waiting_for_the_grace(
    plugin_factory: type[_Plugin],
) -> None:
    plugin = plugin_factory("--grace", "30", "--op-seconds", "60")
    outcome: list[str] = []
    first_update = threading.Event()
    with PluginClient(plugin.address) as client:
        in_flight = client.service_out("shutdown-test", "echo-000")
        watch = client.watch_operations(include_in_flight=True)

        def read() -> None:
            try:
                for op in watch:
                    if op.id == in_flight.id:
                        first_update.set()
                outcome.append("ended")
            except PluginCallError as exc:
                outcome.append(exc.code.name)

        reader = threading.Thread(target=read)
        reader.start()
        # The in-flight operation arrives first, so the watch is registered on the server.
        assert first_update.wait(10), "the watch did not deliver the in-flight operation"
        started = time.monotonic()
        plugin.process.send_signal(signal.SIGTERM)
        _, stderr = plugin.process.communicate(timeout=40)
        elapsed = time.monotonic() - started
        reader.join(timeout=10)
    assert plugin.process.returncode == 0, stderr
    assert elapsed < 10.0, f"shutdown waited {elapsed:.1f} s for an open watch"
    assert outcome == ["ended"]


def test_the_plugin_refuses_new_calls_after_stopping(plugin_factory: type[_Plugin]) -> None:
    plugin = plugin_factory("--grace", "1")
    plugin.process.send_signal(signal.SIGTERM)
    plugin.process.communicate(timeout=15)
    client = PluginClient(plugin.address, timeouts={"Probe": 2.0})
    with client, pytest.raises(PluginCallError) as info:
        client.probe()
    assert info.value.retryable
