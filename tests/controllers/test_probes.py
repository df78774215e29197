"""/healthz and /readyz answer what the controller and the elector say, over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from orchestrator.adapters.probes import Probes, serve


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Probes]]:
    registry = CollectorRegistry()
    Counter("probe_test", "a counter", registry=registry).inc()
    probes = Probes(stall_seconds=3600)
    server = serve("127.0.0.1", 0, registry, probes)
    host, port = server.server_address[:2]
    yield f"http://{host!s}:{port}", probes
    server.shutdown()
    server.server_close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_standby_is_alive_and_ready_starting_is_not_ready(
    endpoint: tuple[str, Probes],
) -> None:
    url, probes = endpoint
    assert _get(url + "/readyz") == (503, "starting\n")
    probes.role = "standby"
    assert _get(url + "/healthz") == (200, "ok\n")
    assert _get(url + "/readyz") == (200, "ok\n")


def test_leader_ready_only_when_synced_and_dead_watch_fails_liveness(
    endpoint: tuple[str, Probes],
) -> None:
    url, probes = endpoint
    probes.role = "leader"
    synced = {"value": False}
    probes.readiness = lambda: "" if synced["value"] else "caches not synced yet"
    assert _get(url + "/readyz") == (503, "caches not synced yet\n")
    synced["value"] = True
    assert _get(url + "/readyz")[0] == 200
    probes.liveness = lambda: "the watch-cu thread died"
    assert _get(url + "/healthz") == (503, "the watch-cu thread died\n")


def test_a_wedged_reconcile_loop_fails_liveness(endpoint: tuple[str, Probes]) -> None:
    url, probes = endpoint
    probes.role = "leader"
    probes.beat()
    assert _get(url + "/healthz")[0] == 200
    probes.stall_seconds = 0.0  # any time since the last beat is now too long
    status, body = _get(url + "/healthz")
    assert status == 503 and "has not come round" in body


def test_metrics_are_served_on_the_same_port(endpoint: tuple[str, Probes]) -> None:
    url, _ = endpoint
    status, body = _get(url + "/metrics")
    assert status == 200 and "probe_test_total 1.0" in body
