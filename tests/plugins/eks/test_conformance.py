"""The conformance kit passes against the EKS plugin driving the EKS emulator, with and without
its journal, and leaves the fleet as it found it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.eks.conftest import NAMES, StartPlugin
from tests.plugins.eks.support import (
    OLD,
    POOLS,
    RECORD,
    REGION,
    ZONE,
    cluster_id,
    route53_traffic,
)
from tests.support.eks_emulator import EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.plugin_harness import kit_outcome


@pytest.mark.parametrize(("journal", "mode"), [(False, "none"), (True, "none"), (True, "route53")])
def test_the_eks_plugin_passes_the_conformance_kit_and_is_left_as_found(
    emulator: EksEmulator, start_plugin: StartPlugin, tmp_path: Path, journal: bool, mode: str
) -> None:
    state = tmp_path / "ops.jsonl" if journal else None
    with Route53Emulator(sync_seconds=1.0) as route53:
        extra = {"traffic": route53_traffic(route53, NAMES)} if mode == "route53" else {}
        running = start_plugin(state_file=state, **extra)
        outcome = kit_outcome(running.address, tmp_path / "kit.xml")
        assert (
            "test_operation_is_idempotent_reaches_a_terminal_state_and_is_watched"
            in outcome["passed"]
        )
        assert any("preflight" in name for name in outcome["passed"])
        if mode == "route53":
            # Service-out ran as a real Route 53 change, so the conflict check was exercised.
            assert "test_conflicting_request_is_aborted_naming_the_operation" in outcome["passed"]
            assert route53.calls("ChangeResourceRecordSets") >= 2
            assert all(route53.weight(ZONE, RECORD, name) == 100 for name in NAMES)
        for name in NAMES:
            assert running.client.get_cluster(cluster_id(name)).in_service
    for name in NAMES:
        cluster = emulator.cluster(REGION, name)
        assert cluster["version"] == OLD and cluster["updates"] == []
        assert cluster["nodegroups"] == dict.fromkeys(POOLS, OLD)
    assert emulator.calls("UpdateClusterVersion") == emulator.calls("UpdateNodegroupVersion") == 0
