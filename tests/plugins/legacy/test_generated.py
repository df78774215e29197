"""The committed stubs in plugins/legacy/_gen/ match plugins/legacy/proto/plugin.proto
(regenerate with scripts/gen-legacy-proto), and speak the original operator's wire names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from plugins.legacy._gen import plugin_pb2, plugin_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
GEN = Path("plugins") / "legacy" / "_gen"


def _tree(base: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_stubs_are_not_stale(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "scripts" / "gen-legacy-proto"), str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
        capture_output=True,
    )
    fresh, committed = _tree(tmp_path / GEN), _tree(ROOT / GEN)
    stale = sorted(k for k in fresh.keys() | committed.keys() if fresh.get(k) != committed.get(k))
    assert not stale, f"legacy stubs are stale ({', '.join(stale)}): run scripts/gen-legacy-proto"


def test_the_stubs_carry_the_original_package_service_and_field_numbers() -> None:
    # The wire shape of ../shared/REFERENCE.md: what an original plugin server understands.
    service = plugin_pb2.DESCRIPTOR.services_by_name["Cluster"]
    assert service.full_name == "plugin.Cluster"
    assert [m.name for m in service.methods] == [
        "HealthCheck",
        "GetVersion",
        "GetClusterStatus",
        "GetOperationStatus",
        "ServiceIn",
        "ServiceOut",
        "UpgradeMaster",
        "UpgradeNodePool",
    ]
    assert service.methods_by_name["HealthCheck"].input_type.full_name == "google.protobuf.Empty"
    fields = {
        name: {f.name: f.number for f in plugin_pb2.DESCRIPTOR.message_types_by_name[name].fields}
        for name in plugin_pb2.DESCRIPTOR.message_types_by_name
    }
    assert fields == {
        "GetVersionRequest": {"clusterID": 1},
        "GetClusterStatusRequest": {"clusterID": 1},
        "GetOperationStatusRequest": {"clusterID": 1, "operationID": 2, "type": 3},
        "ServiceInRequest": {"clusterID": 1},
        "ServiceOutRequest": {"clusterID": 1},
        "Operation": {"type": 1, "operationID": 2},
        "OperationStatus": {"status": 1},
        "ClusterStatus": {"status": 1, "isAvailable": 2},
        "ClusterVersion": {"master": 1, "nodePools": 2},
        "MasterVersion": {"clusterID": 1, "version": 2},
        "NodePoolVersion": {"clusterID": 1, "nodePoolID": 2, "version": 3},
    }
    assert dict(plugin_pb2.OperationStatusType.items()) == {
        "UNKNOWN": 0,
        "RUNNING": 1,
        "DONE": 2,
        "FAILED": 3,
    }
    assert dict(plugin_pb2.ClusterStatusType.items()) == {
        "STATUS_SERVICE_IN": 0,
        "STATUS_SERVICE_OUT": 1,
    }
    assert plugin_pb2_grpc.ClusterStub.__module__ == "plugins.legacy._gen.plugin_pb2_grpc"
