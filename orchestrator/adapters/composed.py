"""The run's provider, built from what access allowed: one plugin (GrpcProvider), or a provider
composed of one plugin per capability (orchestrator.pipeline.compose) whose parts are checked
for the capabilities of their roles before anything is asked of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from fleetupgrade.plugin.v1 import identity_pb2
from orchestrator.adapters.provider import (
    GrpcProvider,
    KeptInventory,
    OperationTracker,
    PluginPool,
    call_error,
)
from orchestrator.adapters.secrets import SecretError, TLSResolver
from orchestrator.engine.access import Access, Composition, Endpoint
from orchestrator.engine.observations import OpObs
from orchestrator.pipeline.compose import (
    ComposedProvider,
    PartProvider,
    Route,
    missing_capabilities,
)
from orchestrator.pipeline.driver import CallError
from plugins.sdk.client import PluginCallError

__all__ = ["BuiltProvider", "NoProvider", "PluginBuilder", "build_provider", "capability_names"]

_PREFIX = "PLUGIN_CAPABILITY_"


@dataclass(frozen=True)
class BuiltProvider:
    """The run's provider, the endpoint its ClusterUpgrades record (`spec.provider`; the
    inventory part's for a composed one) and the identity its clusters carry (the inventory
    part's: docs/plugin-contract.md, "Provider identity")."""

    provider: PartProvider
    endpoint: str
    identity: str


@dataclass(frozen=True)
class NoProvider:
    """Why nothing can be asked now: the run's Degraded condition and when to look again."""

    reason: str
    message: str
    retry: float
    #: The plugin's answer when it did not answer what it is or what it can do (None: TLS, a
    #: part lacking a capability): a run over several FleetProviders goes on without that one,
    #: a run in flight with its clusters unknown (orchestrator.controllers.reach).
    error: CallError | None = None


def capability_names(values: frozenset[int]) -> frozenset[str]:
    """Declared capabilities by name, without the PLUGIN_CAPABILITY_ prefix (unknown ones:
    a newer plugin's, left out)."""
    out = set()
    for v in values:
        try:
            out.add(identity_pb2.PluginCapability.Name(v).removeprefix(_PREFIX))  # type: ignore[arg-type]
        except ValueError:
            continue
    return frozenset(out)


@dataclass
class PluginBuilder:
    """Reaches a run's plugins: each one's client, identity and GrpcProvider (its operations
    followed), and a composed provider's parts with their capabilities checked."""

    pool: PluginPool
    tls: TLSResolver
    tracker: OperationTracker
    clock: Callable[[], datetime]
    count_operation: Callable[[str, OpObs], None]
    inventories: dict[str, KeptInventory]

    def plugin(self, target: Endpoint) -> tuple[GrpcProvider, str] | NoProvider:
        """The GrpcProvider of one endpoint, and its identity."""
        endpoint = target.endpoint
        try:
            client = self.pool.get(
                endpoint,
                self.tls.client_tls(target.secret_namespace, target.ops_endpoint(), target.field),
            )
        except SecretError as err:
            return NoProvider("TLSConfigError", str(err), 30.0)
        try:
            identity = self.pool.identity(endpoint, client)
        except CallError as err:
            return NoProvider("PluginUnavailable", str(err), 5.0, err)
        self.tracker.follow(client)
        provider = GrpcProvider(
            client,
            self.tracker,
            self.clock,
            lambda op: self.count_operation(endpoint, op),
            kept=self.inventories.setdefault(
                endpoint, KeptInventory(on_missed=self.pool.count_missed)
            ),
        )
        return provider, identity

    def provider(self, access: Access) -> BuiltProvider | NoProvider:
        """The run's provider from what access allowed: its one plugin, or the composition."""
        if access.composition is not None:
            return self.composed(access.composition)
        built = self.plugin(access.provider)
        if isinstance(built, NoProvider):
            return built
        return BuiltProvider(built[0], access.provider.endpoint, built[1])

    def composed(self, composition: Composition) -> BuiltProvider | NoProvider:
        """Every part's plugin (one per FleetProvider), their capabilities checked against
        their roles (a Degraded message naming the FleetProvider, the part and what it lacks)."""
        plugins: dict[str, tuple[GrpcProvider, str]] = {}
        declared: dict[str, frozenset[str]] = {}
        for part in composition.parts.values():
            if part.name in plugins:
                continue
            built = self.plugin(part.endpoint)
            if isinstance(built, NoProvider):
                return NoProvider(
                    built.reason,
                    f"FleetProvider {composition.name}: part {part.role} (FleetProvider "
                    f"{part.name}): {built.message}",
                    built.retry,
                    built.error,
                )
            plugins[part.name] = built
            try:
                declared[part.name] = capability_names(built[0].client.capabilities())
            except PluginCallError as err:
                error = call_error(err)
                return NoProvider("PluginUnavailable", str(error), 5.0, error)
        roles = {p.role: (p.name, p.named) for p in composition.parts.values()}
        missing = missing_capabilities(composition.name, roles, declared)
        if missing:
            return NoProvider("PartLacksCapability", "; ".join(missing), 30.0)

        def route(role: str) -> Route:
            part = composition.parts[role]
            return Route(role, part.name, plugins[part.name][0], part.template)

        preflight = composition.parts["preflight"]
        has_preflight = preflight.named or "PREFLIGHT_UPGRADE" in declared[preflight.name]
        inventory = composition.parts["inventory"]
        provider = ComposedProvider(
            composition.name,
            route("inventory"),
            route("traffic"),
            route("upgrades"),
            route("preflight") if has_preflight else None,
            self.clock,
        )
        return BuiltProvider(provider, inventory.endpoint.endpoint, plugins[inventory.name][1])


def build_provider(
    access: Access,
    pool: PluginPool,
    tls: TLSResolver,
    tracker: OperationTracker,
    clock: Callable[[], datetime],
    count_operation: Callable[[str, OpObs], None],
    inventories: dict[str, KeptInventory],
) -> BuiltProvider | NoProvider:
    """The run's provider from what access allowed (its plugins' operations followed).

    inventories: per plugin endpoint, its inventory kept by the caller across reconciles
    (GrpcProvider.kept)."""
    return PluginBuilder(pool, tls, tracker, clock, count_operation, inventories).provider(access)
