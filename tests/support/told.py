"""A what-if fleet and store that say what changed between passes, as a provider fed by its
operation watch and a controller fed by its ClusterUpgrade watch would (engine.index's
"caller says what changed" path): `TellingFleet` gives every snapshot the `Changes` since the
previous one, `TellingStore` the names written since the last `take`. Either can be told to
forget some (a caller that misses an event), which the driver's periodic full pass must find.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator import api
from orchestrator.engine.decide import Call, Upgrade, with_status
from orchestrator.engine.observations import Changes, OpObs, Snapshot
from orchestrator.pipeline.simulate import ModelFleet

__all__ = ["Held", "NoChecks", "TellingFleet", "TellingStore"]


@dataclass
class TellingFleet(ModelFleet):
    """A ModelFleet whose snapshots say which clusters and operations changed since the last."""

    #: Cluster ids whose changes are never told (a provider that misses them).
    untold: set[str] = field(default_factory=set)
    _clusters: set[str] = field(default_factory=set)
    _operations: set[str] = field(default_factory=set)
    _by_request: dict[str, OpObs] = field(default_factory=dict)
    _last: object = None

    def snapshot(self, cluster_ids: Sequence[str] = ()) -> Snapshot:
        """The inventory and operations now, with what changed since the previous snapshot."""
        changes = None
        if self._last is not None:
            changes = Changes(
                self._last,
                frozenset(self._clusters - self.untold),
                frozenset(self._operations),
            )
        self._clusters, self._operations = set(), set()
        snap = Snapshot(dict(self.clusters), dict(self._by_request), changes=changes)
        self._last = snap.token
        return snap

    def execute(self, action: Call, now: float) -> OpObs:
        """ModelFleet's, noting what it changed."""
        op = super().execute(action, now)
        self._note(op)
        return op

    def advance_to(self, now: float) -> None:
        """ModelFleet's, noting the operations that end and their clusters."""
        ending = [self.ops[i] for i, end in self.ends_at.items() if end <= now]
        super().advance_to(now)
        for op in ending:
            self._note(self.ops[op.id])

    def _note(self, op: OpObs) -> None:
        self._clusters.add(op.cluster_id)
        self._operations.add(op.request_id)
        self._by_request[op.request_id] = op


@dataclass
class TellingStore:
    """ClusterUpgrades in memory (the driver's UpgradeStore) that say which were written."""

    upgrades: dict[str, Upgrade]
    #: Names whose writes are never told (a watch that misses their events).
    untold: set[str] = field(default_factory=set)
    _written: set[str] = field(default_factory=set)

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        self.upgrades[upgrade.name] = with_status(self.upgrades[upgrade.name], status)
        self._written.add(upgrade.name)

    def take(self) -> set[str]:
        """The names written since the last take (less the untold)."""
        out, self._written = self._written - self.untold, set()
        return out


class NoChecks:
    """The driver's Checker for a run without health checks."""

    def evaluate(self, checks: object, clusters: object, stage: str) -> list[object]:
        return []


class Held:
    """The driver's Fence: the Lease always held."""

    def held(self) -> bool:
        return True
