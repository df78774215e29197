"""The conformance kit passes against the bridge in front of an original-protocol server, over
plaintext and TLS on both sides, and leaves the fleet as it found it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sdk.server import ServerTLS
from tests.plugins.legacy.conftest import IDS, OLD, POOLS, StartBridge
from tests.support.certs import TestPKI, generate_pki
from tests.support.legacy_server import SERVICE_IN, SERVICE_OUT, LegacyServer, legacy_fleet
from tests.support.legacy_server import legacy_server as serve_legacy
from tests.support.plugin_harness import kit_outcome


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return generate_pki(tmp_path_factory.mktemp("pki"))


def _left_as_found(address: str, server: LegacyServer, tls: ClientTLS | None = None) -> None:
    with PluginClient(address, tls=tls) as client:
        clusters = client.list_clusters()
    assert [c.id for c in clusters] == sorted(IDS)
    assert all(c.in_service and c.available for c in clusters)
    assert {c.control_plane_version for c in clusters} == {OLD}
    assert all(not c.HasField("current_operation") for c in clusters)
    # The kit's only real changes: service-out and back, each sent to the upstream once.
    started = [(s.type, s.cluster_id) for s in server.model.started]
    assert started and len(started) % 2 == 0
    assert started == [(SERVICE_OUT, IDS[0]), (SERVICE_IN, IDS[0])] * (len(started) // 2)
    assert server.model.running() == 0


def test_the_bridge_passes_the_conformance_kit_and_is_left_as_found(
    upstream: LegacyServer, start_bridge: StartBridge, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    labels = {cid: {"tier": "gold" if i % 2 else "silver"} for i, cid in enumerate(IDS)}
    bridge = start_bridge(state_file=str(state_dir / "legacy.json"), clusters=labels)
    outcome = kit_outcome(bridge.address, tmp_path / "kit.xml")
    assert outcome["failed"] == []
    assert len(outcome["passed"]) >= 50
    assert any("match_labels" in name for name in outcome["passed"])
    # Skipped: only what the bridge does not declare (gates, workloads, metrics, preflight:
    # the original protocol has none of them) and the listing of changes since a revision
    # (optional; the bridge keeps no revisions).
    assert outcome["skipped"], "the kit checks that undeclared RPCs are refused"
    for entry in outcome["skipped, why"]:
        assert "is outside the declared capabilities" in entry or "keeps no revisions" in entry, (
            entry
        )
    _left_as_found(bridge.address, upstream)


def test_the_bridge_passes_the_kit_over_tls_to_an_upstream_over_tls(
    start_bridge: StartBridge, tmp_path: Path, pki: TestPKI
) -> None:
    upstream_tls = grpc.ssl_server_credentials([(pki.server.key_pem, pki.server.cert_pem)])
    with serve_legacy(legacy_fleet(IDS, OLD, POOLS), tls=upstream_tls) as server:
        bridge = start_bridge(
            upstream=f"localhost:{server.port}",
            upstream_tls=ClientTLS(ca_file=pki.ca_file),
            tls=ServerTLS(pki.server.cert_file, pki.server.key_file, pki.ca_file),
        )
        client_tls = ClientTLS(
            ca_file=pki.ca_file, cert_file=pki.client.cert_file, key_file=pki.client.key_file
        )
        outcome = kit_outcome(bridge.address, tmp_path / "kit.xml", client_tls)
        assert outcome["failed"] == [] and len(outcome["passed"]) >= 45
        _left_as_found(bridge.address, server, client_tls)
