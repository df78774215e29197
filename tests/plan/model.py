"""Fleet and spec builders for planner tests (the simulation itself is orchestrator.simulate)."""

from __future__ import annotations

from orchestrator import api
from orchestrator.fleet import ClusterObs, PoolObs
from orchestrator.simulate import ModelFleet


def make_fleet(n: int, version: str = "1.28.5", pools: int = 2, staged: bool = False) -> ModelFleet:
    clusters = {}
    for i in range(n):
        cid = f"c{i:05d}"
        labels = {"stage": ("canary", "early", "main")[i % 3]} if staged else {}
        clusters[cid] = ClusterObs(
            id=cid,
            control_plane_version=version,
            labels=labels,
            node_pools=tuple(PoolObs(f"pool-{p}", version) for p in range(pools)),
        )
    return ModelFleet(clusters)


def spec_for(
    fleet: ModelFleet, version: str, required: int, **strategy: object
) -> api.ClusterVersionSpec:
    return api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": required,
            "opsEndpoint": {"endpoint": "127.0.0.1:9000", "insecure": True},
            "clusters": [{"id": cid, "version": version} for cid in sorted(fleet.clusters)],
            **({"strategy": strategy} if strategy else {}),
        }
    )
