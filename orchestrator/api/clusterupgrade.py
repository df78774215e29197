"""The ClusterUpgrade kind: one cluster's upgrade within a run, the record every decision reads."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from orchestrator.api.fields import GROUP, Condition, Version, _Model
from orchestrator.api.rollout import HealthState, NodePoolTarget

__all__ = [
    "CLUSTER_UPGRADE_KIND",
    "CLUSTER_UPGRADE_PLURAL",
    "LABEL_PROVIDER",
    "LABEL_RUN",
    "ClusterUpgradeSpec",
    "ClusterUpgradeStatus",
    "HookPhase",
    "HookStatus",
    "UpgradePhase",
]


CLUSTER_UPGRADE_KIND = "ClusterUpgrade"


CLUSTER_UPGRADE_PLURAL = "clusterupgrades"


#: Label on every ClusterUpgrade: the name of its UpdateRun.
LABEL_RUN = f"{GROUP}/update-run"


#: Label a run over several FleetProviders (spec.providerRefs) gives every cluster of its
#: inventory: the name of the FleetProvider that reported it, so stages select by provider
#: as by any label (orchestrator.pipeline.multi).
LABEL_PROVIDER = f"{GROUP}/provider"


class UpgradePhase(StrEnum):
    """Where one ClusterUpgrade stands (docs/architecture.md, per-cluster lifecycle)."""

    PENDING = "Pending"
    #: The preUpgrade hook runs (the cluster is held, still in service).
    PRE_HOOK = "PreUpgradeHook"
    SERVICING_OUT = "ServicingOut"
    UPGRADING_CONTROL_PLANE = "UpgradingControlPlane"
    UPGRADING_NODE_POOLS = "UpgradingNodePools"
    VERIFYING = "Verifying"
    #: The postUpgrade hook runs (after the checks passed, before the service-in).
    POST_HOOK = "PostUpgradeHook"
    SERVICING_IN = "ServicingIn"
    UPGRADED = "Upgraded"
    FAILED = "Failed"
    #: Not started, with the reason (the provider refused, a claim is held elsewhere...).
    BLOCKED = "Blocked"
    #: Not upgraded by this run: already at target, gone from the inventory, skipped by a person.
    SKIPPED = "Skipped"


class ClusterUpgradeSpec(_Model):
    """The pinned intent for one cluster in one run."""

    cluster_id: str = Field(min_length=1, max_length=512)
    stage: str = Field(min_length=1, max_length=63)
    stage_index: int = Field(ge=0)
    version: Version
    node_version: Version
    node_pools: list[NodePoolTarget] | None = None
    provider: str = Field(
        min_length=1, description="The plugin endpoint the run reached the cluster through."
    )
    provider_id: str | None = Field(
        default=None,
        max_length=512,
        description="The identity of the provider the cluster belongs to (its plugin's name and "
        "GetPluginInfo fleet_id): clusters are (providerId, clusterId) wherever runs meet.",
    )
    provider_name: str | None = Field(
        default=None,
        max_length=253,
        description="The FleetProvider the cluster was reached through (spec.providerRef or one "
        "of spec.providerRefs); unset for spec.opsEndpoint.",
    )

    def pool_target(self, pool: str) -> str:
        """The target version of a node pool."""
        for p in self.node_pools or []:
            if p.name == pool:
                return p.version
        return self.node_version


class HookPhase(StrEnum):
    """Where one hook run stands."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class HookStatus(_Model):
    """One hook run, recorded before it starts (never run twice for one attempt)."""

    kind: Literal["preUpgrade", "postUpgrade"]
    #: Job name, or the idempotency key sent with the HTTP call.
    id: str
    phase: HookPhase = HookPhase.RUNNING
    start_time: str
    message: str | None = None


class ClusterUpgradeStatus(_Model):
    """One cluster's progress; nothing here is ever compacted away."""

    phase: UpgradePhase = UpgradePhase.PENDING
    step: str | None = Field(default=None, description="The step in flight, e.g. nodePool/a.")
    request_id: str | None = None
    next_request_ids: list[str] | None = Field(
        default=None,
        description="The node-pool steps that follow the one on record, persisted with its "
        "intent (invariant 6) so that each starts, once the one before it succeeded, without a "
        "write of its own: the step in flight is the first of requestId and these whose "
        "operation has not succeeded.",
    )
    operation_id: str | None = None
    attempt: int = 0
    step_start_time: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None
    health: HealthState | None = None
    hook: HookStatus | None = Field(default=None, description="The hook of this attempt.")
    retry_round: int = Field(default=0, description="The last spec.retry.round applied.")
    conditions: list[Condition] | None = None
