"""The OperationTracker, shared by every plugin the orchestrator follows: operations are kept
by (plugin, operation id), as two plugins may hand out the same id."""

from __future__ import annotations

from orchestrator.adapters.provider import OperationTracker
from orchestrator.engine.observations import OpKind, OpObs, OpState


def _op(request: str, state: OpState, cluster: str) -> OpObs:
    return OpObs("op-1", OpKind.CONTROL_PLANE, cluster, state, request_id=request)


def test_two_plugins_with_the_same_operation_id_are_kept_apart() -> None:
    ended: list[tuple[str, OpObs]] = []
    tracker = OperationTracker(lambda plugin, op: ended.append((plugin, op)))
    gke = _op("uid:g1:controlPlane:1.29.1:0", OpState.SUCCEEDED, "g1")
    eks = _op("uid:e1:controlPlane:1.29.1:0", OpState.RUNNING, "e1")
    assert tracker.put("gke:9000", gke) is True
    # The EKS plugin's op-1 is another operation: not taken for the GKE one's end.
    assert tracker.put("eks:9000", eks) is False
    assert tracker.get("gke:9000", "op-1") == gke
    assert tracker.get("eks:9000", "op-1") == eks
    assert [op.cluster_id for op in tracker.in_flight()] == ["e1"]
    assert tracker.by_request() == {gke.request_id: gke, eks.request_id: eks}
    # Its own end is the first terminal state of *its* op-1.
    assert tracker.put("eks:9000", _op(eks.request_id, OpState.FAILED, "e1")) is True
    tracker.forget("gke:9000", "op-1")
    assert tracker.get("gke:9000", "op-1") is None
    assert tracker.get("eks:9000", "op-1") is not None
