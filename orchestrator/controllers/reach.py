"""What a run acts through: the plugin of its providerRef / opsEndpoint, or the several of its
providerRefs (orchestrator.pipeline.multi), as the UpdateRun controller reached them this pass."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NoReturn

from orchestrator import api
from orchestrator.engine.decide import Call, Preflight, Upgrade
from orchestrator.engine.initialize import Pinned, pin_upgrades
from orchestrator.engine.observations import ClusterObs, OpObs, Snapshot
from orchestrator.engine.validate import Problem
from orchestrator.pipeline.compose import PartProvider
from orchestrator.pipeline.driver import CallError, Provider
from orchestrator.pipeline.multi import Member, MultiProvider, named, pin_across, route

__all__ = ["Reached", "RunPlugins", "Unreached"]


@dataclass(frozen=True)
class Reached:
    """A plugin the run reached: its FleetProvider's name ("" for spec.opsEndpoint), its
    endpoint, what it says it is, and the driver's view of it."""

    name: str
    endpoint: str
    identity: str
    provider: PartProvider


@dataclass(frozen=True)
class Unreached:
    """A FleetProvider of a run over several whose plugin could not be asked what it is."""

    name: str
    endpoint: str
    error: CallError


@dataclass(frozen=True)
class _Down:
    """The driver's view of an unreached member: every question fails with its error."""

    error: CallError

    @property
    def supports_preflight(self) -> bool:
        return False

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        raise self.error

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        raise self.error

    def call(self, call: Call) -> OpObs:
        raise self.error

    # Started (driver.StartsRequests), as its plugin's adapter would be: the error comes
    # with the answer, never from the start.

    def start_preflight(
        self, cluster_id: str, version: str, pools: Mapping[str, str]
    ) -> Callable[[], Preflight]:
        return self._failing

    def start_call(self, call: Call) -> Callable[[], OpObs]:
        return self._failing

    def _failing(self) -> NoReturn:
        raise self.error


@dataclass
class RunPlugins:
    """The plugins of one run this pass: one (`several` False) or a FleetProvider each."""

    plugins: Sequence[Reached | Unreached]
    several: bool
    clock: Callable[[], datetime]
    #: The multi-provider view built by `provider` (its `down` names who did not answer).
    multi: MultiProvider | None = field(default=None, init=False)

    #: FleetProvider name ("" for a run's one plugin) → why it failed to catch up this pass
    #: (`learn`): the driver's view of it is down for the pass (`provider`).
    failed: dict[str, CallError] = field(default_factory=dict, init=False)

    @property
    def one(self) -> Reached | Unreached:
        """The plugin of a one-provider run (Unreached: it did not say what it is)."""
        assert not self.several
        return self.plugins[0]

    def identity_of_one(self, pinned: Iterable[str]) -> str:
        """What the one plugin is: as it says, or when it did not answer, what its clusters
        were pinned with (pinned: their providerIds), unverified: they are unknown anyway."""
        one = self.one
        if isinstance(one, Reached):
            return one.identity
        return next(iter(pinned), "")

    @property
    def identities(self) -> frozenset[str]:
        """What the reached plugins are (an operation's end wakes the runs on its provider)."""
        return frozenset(p.identity for p in self.reached())

    def reached(self) -> list[Reached]:
        """The plugins that answered."""
        return [p for p in self.plugins if isinstance(p, Reached)]

    def _members(self, pinned: Mapping[str, str]) -> list[Member]:
        """As multi.Member; an unreached one takes the identity its clusters were pinned with
        (pinned: FleetProvider name → identity), unverified: its clusters are unknown anyway."""
        out = []
        for p in self.plugins:
            identity = p.identity if isinstance(p, Reached) else pinned.get(p.name, "")
            out.append(Member(p.name, p.endpoint, identity, self._driven(p)))
        return out

    def pin(
        self, run: str, spec: api.UpdateRunSpec, source: api.ClusterVersionSpec | None
    ) -> Pinned | list[Problem]:
        """The run's ClusterUpgrades from the inventory of now (every member's); raises
        CallError (naming the FleetProvider) when a plugin does not answer."""
        if not self.several:
            one = self.one
            if isinstance(one, Unreached):
                raise one.error
            return pin_upgrades(
                run,
                spec,
                one.provider.inventory(),
                source,
                provider=one.endpoint,
                provider_id=one.identity,
                provider_name=one.name or None,
            )
        inventories: dict[str, Mapping[str, ClusterObs]] = {}
        for p in self.plugins:
            if isinstance(p, Unreached):
                raise named(p.name, p.error)
            try:
                inventories[p.name] = p.provider.inventory()
            except CallError as err:
                raise named(p.name, err) from err
        return pin_across(run, spec, self._members({}), inventories, source)

    def routes(self, upgrades: Iterable[Upgrade]) -> dict[str, str] | Problem:
        """Cluster id → FleetProvider name from what each ClusterUpgrade pinned; a Problem when
        a member left providerRefs or points at another provider now (multi.route)."""
        pins = [(u.cluster_id, u.spec.provider_id or "", u.spec.provider_name) for u in upgrades]
        pinned = {name: identity for _, identity, name in pins if name}
        members = self._members(pinned)
        unverified = {p.name for p in self.plugins if isinstance(p, Unreached)}
        checked = route([p for p in pins if p[2] not in unverified], members)
        if isinstance(checked, Problem):
            return checked
        checked.update({cid: name for cid, _, name in pins if name in unverified})
        return checked

    def provider(self, routes: Mapping[str, str]) -> Provider:
        """The driver's Provider: the one plugin, or every member over routes. A plugin that
        did not answer (Unreached, or failed to catch up in `learn`) is down for the pass:
        every question to it fails, so its clusters are unknown (driver.step, multi)."""
        if not self.several:
            return self._driven(self.one)
        self.multi = MultiProvider.over(self._members({}), routes, self.clock)
        return self.multi

    def _driven(self, p: Reached | Unreached) -> Provider:
        """The driver's view of one plugin this pass: down (every question fails with why)
        when it did not answer what it is or failed to catch up in `learn`."""
        if isinstance(p, Unreached):
            return _Down(p.error)
        failed = self.failed.get(p.name)
        return p.provider if failed is None else _Down(failed)

    def learn(self, steps: Sequence[tuple[str, str, str]], routes: Mapping[str, str]) -> None:
        """GrpcProvider.learn on each reached plugin, for the steps of its clusters. One that
        fails here is down for the pass (`failed`): what it did is unknown, and an operation
        it could not tell about must not read as one it forgot (OperationLost)."""
        self.failed = {}
        for p in self.reached():
            mine = [s for s in steps if not self.several or routes.get(s[2]) == p.name]
            if not mine:
                continue
            try:
                p.provider.learn(mine)
            except CallError as err:
                self.failed[p.name] = err

    @property
    def down(self) -> dict[str, str]:
        """FleetProvider name → why it did not answer this pass (a run over several)."""
        found = {p.name: str(p.error) for p in self.plugins if isinstance(p, Unreached)}
        if self.multi is not None:
            found.update(self.multi.down)
        return found
