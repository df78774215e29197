"""`fleet-orchestrator status` names the node pools a chain starts after the one on record
(status.nextRequestIds): while they run, status.step stays the chain's first."""

from __future__ import annotations

from orchestrator.engine.decide import request_id
from orchestrator.operate import read


def test_the_step_names_the_pools_chained_after_it() -> None:
    chained = [request_id("uid", "c1", f"nodePool/{p}", "1.29.1", 0) for p in ("b", "c")]
    status = {"phase": "UpgradingNodePools", "step": "nodePool/a", "nextRequestIds": chained}
    assert read._step(status) == "nodePool/a, then b, c"
    assert read._step({"phase": "UpgradingNodePools", "step": "nodePool/a"}) == "nodePool/a"
    assert read._step({"phase": "Pending"}) == ""
