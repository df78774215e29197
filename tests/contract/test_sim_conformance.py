"""The conformance kit passes against a live simulated fleet, over plaintext, TLS and mTLS."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sdk.server import ServerTLS
from plugins.sim import SimOptions, Simulator
from tests.support.certs import TestPKI
from tests.support.plugin_harness import kit_outcome


@pytest.fixture
def sims() -> Iterator[list[Simulator]]:
    started: list[Simulator] = []
    yield started
    for sim in started:
        sim.stop(grace=0)


def _start(sims: list[Simulator], tmp_path: Path, tls: ServerTLS | None = None) -> Simulator:
    """A durable sim (journal in tmp_path/state); sims[-1] is always the running one."""
    sim = Simulator(
        SimOptions(
            generate=6,
            step_seconds=0.2,
            seed=1,
            tls=tls,
            monitor_file=str(tmp_path / "monitor.json"),
            registry=CollectorRegistry(),
            state_dir=str(tmp_path / "state"),
        )
    )
    sims.append(sim)
    return sim


def _restart(sims: list[Simulator]) -> Callable[[], None]:
    """The kit's restart hook: stops the running sim and starts it again on its address."""

    def restart() -> None:
        old = sims[-1]
        old.stop(grace=0)
        options = replace(old.options, listen=old.address, registry=CollectorRegistry())
        sims.append(Simulator(options))

    return restart


def _kit(
    sims: list[Simulator], tmp_path: Path, tls: ClientTLS | None = None
) -> dict[str, list[str]]:
    return kit_outcome(sims[-1].address, tmp_path / "kit.xml", tls, _restart(sims))


def test_the_sim_passes_the_conformance_kit_and_is_left_as_found(
    sims: list[Simulator], tmp_path: Path
) -> None:
    _start(sims, tmp_path)
    outcome = _kit(sims, tmp_path)
    assert outcome["failed"] == []
    assert len(outcome["passed"]) >= 50
    # Only the gate checks are skipped: the sim does not declare PLUGIN_CAPABILITY_GATES.
    assert outcome["skipped"] and all("gate" in name for name in outcome["skipped"])
    for check in (
        "test_preflight_changes_nothing",
        "test_node_pools_alone_are_judged_against_the_control_plane_it_has",
        "test_a_resumed_watch_replays_the_changes_after_its_revision",
        "test_operations_and_request_ids_survive_a_restart",
        "test_not_found_carries_error_info",
    ):
        assert check in outcome["passed"]
    assert len(sims) == 2  # the durability check restarted it once
    sim = sims[-1]
    with PluginClient(sim.address) as client:
        clusters = client.list_clusters()
    assert len(clusters) == 6
    assert all(c.in_service and c.available for c in clusters)
    assert {c.control_plane_version for c in clusters} == {"1.28.5"}
    snapshot = sim.monitor.snapshot()
    assert snapshot["duplicate_mutations"] == 0
    assert snapshot["operations_in_flight"] == 0


def test_the_sim_passes_the_conformance_kit_over_tls(
    sims: list[Simulator], tmp_path: Path, pki: TestPKI
) -> None:
    _start(sims, tmp_path, ServerTLS(pki.server.cert_file, pki.server.key_file))
    outcome = _kit(sims, tmp_path, ClientTLS(ca_file=pki.ca_file))
    assert outcome["failed"] == [] and len(outcome["passed"]) >= 50


def test_the_sim_passes_the_conformance_kit_over_mtls(
    sims: list[Simulator], tmp_path: Path, pki: TestPKI
) -> None:
    server_tls = ServerTLS(pki.server.cert_file, pki.server.key_file, client_ca_file=pki.ca_file)
    _start(sims, tmp_path, server_tls)
    client_tls = ClientTLS(
        ca_file=pki.ca_file, cert_file=pki.client.cert_file, key_file=pki.client.key_file
    )
    outcome = _kit(sims, tmp_path, client_tls)
    assert outcome["failed"] == [] and len(outcome["passed"]) >= 50
