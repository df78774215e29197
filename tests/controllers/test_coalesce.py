"""Operations that end close together wake their run once: one pass follows them all."""

from __future__ import annotations

import time
from typing import cast

from orchestrator.adapters.kube import KubeClient
from orchestrator.adapters.metrics import Metrics
from orchestrator.controllers.manager import Controller
from orchestrator.controllers.updaterun import OPERATION_WAKE
from orchestrator.engine.observations import OpKind, OpObs, OpState
from orchestrator.pipeline.crossrun import endpoint_identity

ENDPOINT = "sim:9000"


def _ended(i: int) -> OpObs:
    return OpObs(f"op-{i}", OpKind.NODE_POOL, f"c{i}", OpState.SUCCEEDED, f"other-uid:c{i}")


def test_operations_ending_within_the_wake_wake_their_run_once_after_it() -> None:
    # Nothing here reaches an apiserver: the controller is made, never run.
    ctl = Controller(cast(KubeClient, None), Metrics(), "team-a", 60.0, "test")
    ctl.run_controller.providers[("team-a", "mine")] = frozenset({endpoint_identity(ENDPOINT)})
    ctl.run_controller.providers[("team-a", "elsewhere")] = frozenset({"another-provider"})
    start = time.monotonic()
    for i in range(5):
        ctl.tracker.put(ENDPOINT, _ended(i))
        ctl._on_operation_done(ENDPOINT, _ended(i))
    # Not before the wake: the ends that come meanwhile ride on the same pass.
    assert ctl.queue.get(timeout=0) is None
    key = ctl.queue.get(timeout=5.0)
    assert key == ("ur", "team-a", "mine")
    assert time.monotonic() - start >= OPERATION_WAKE
    # Once: the five ends are one pass, and the run on another provider is not woken.
    assert ctl.queue.get(timeout=OPERATION_WAKE * 3) is None
