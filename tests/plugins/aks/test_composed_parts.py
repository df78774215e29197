"""The run's provider built from a composed FleetProvider (orchestrator.adapters.composed)
over real AKS plugins on loopback: each part's declared capabilities are checked against its
role before anything is asked of it, and the run's clusters carry the inventory part's
identity."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from orchestrator import api
from orchestrator.adapters.composed import BuiltProvider, NoProvider, build_provider
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.provider import OperationTracker, PluginPool
from orchestrator.adapters.secrets import TLSResolver
from orchestrator.engine.access import Access, AccessPolicy, check_access
from orchestrator.pipeline.compose import ComposedProvider
from tests.plugins.aks.conftest import NAMES, StartPlugin
from tests.plugins.aks.support import GROUP, SUBSCRIPTION, cluster_id

POLICY = AccessPolicy.default("fleet-upgrade-system")


@pytest.fixture
def pool() -> Iterator[PluginPool]:
    p = PluginPool(Metrics(CollectorRegistry()), "composed-tests")
    yield p
    p.close()


def access(endpoints: dict[str, str], parts: dict[str, Any]) -> Access:
    providers: dict[str, api.FleetProviderSpec | None] = {
        name: api.FleetProviderSpec.model_validate(
            {"endpoint": ep, "insecure": True, "allowedNamespaces": {}}
        )
        for name, ep in endpoints.items()
    }
    providers["composed"] = api.FleetProviderSpec.model_validate(
        {"parts": parts, "allowedNamespaces": {"names": ["team-a"]}}
    )
    spec = api.UpdateRunSpec.model_validate(
        {"providerRef": {"name": "composed"}, "clusters": [{"id": "c1", "version": "1.30.3"}]}
    )
    found = check_access("team-a", spec, providers, {}, POLICY)
    assert isinstance(found, Access), found
    return found


def build(found: Access, pool: PluginPool) -> BuiltProvider | NoProvider:
    tracker = OperationTracker(lambda endpoint, op: None)
    try:
        return build_provider(
            found,
            pool,
            TLSResolver(kube=None),  # type: ignore[arg-type]  # insecure: no Secret is read
            tracker,
            lambda: datetime.now(UTC),
            lambda endpoint, op: None,
            {},
        )
    finally:
        tracker.stop()


def test_a_part_lacking_its_roles_capability_is_named_and_nothing_is_built(
    start_plugin: StartPlugin, pool: PluginPool
) -> None:
    # The AKS plugin by default moves no traffic (no CLUSTER_SERVICE): it cannot be the
    # traffic part.
    aks = start_plugin(traffic="unsupported")
    found = access(
        {"aks": aks.address},
        {"inventory": {"name": "aks"}, "traffic": {"name": "aks"}, "upgrades": {"name": "aks"}},
    )
    built = build(found, pool)
    assert isinstance(built, NoProvider)
    assert built.reason == "PartLacksCapability"
    assert built.message == (
        "FleetProvider composed: part traffic (FleetProvider aks) does not declare capability "
        "CLUSTER_SERVICE; name a plugin that does in spec.parts.traffic"
    )


def test_the_clusters_carry_the_inventory_parts_identity_and_the_upgrades_parts_versions(
    start_plugin: StartPlugin, pool: PluginPool
) -> None:
    # Two plugins over one emulated subscription: one selecting the clusters by id (its
    # fleet_id a digest of that selection), one discovering the resource group (fleet_id
    # aks:SUB:RG). The first is the inventory and traffic part, the second upgrades.
    listed = start_plugin()
    discovered = start_plugin(
        clusters={"discover": [{"subscription": SUBSCRIPTION, "resourceGroup": GROUP}]}
    )
    found = access(
        {"listed": listed.address, "discovered": discovered.address},
        {
            "inventory": {"name": "listed"},
            "traffic": {"name": "listed"},
            "upgrades": {"name": "discovered"},
        },
    )
    built = build(found, pool)
    assert isinstance(built, BuiltProvider), built
    listed_info = listed.client.info()
    assert built.identity == f"{listed_info.name}/{listed_info.fleet_id}"
    assert built.identity != f"aks/aks:{SUBSCRIPTION}:{GROUP}"  # not the upgrades part's
    assert built.endpoint == listed.address
    assert isinstance(built.provider, ComposedProvider)
    # Both plugins declare PREFLIGHT_UPGRADE: the upgrades part answers preflight by default.
    assert built.provider.preflight_route is not None
    assert built.provider.preflight_route.name == "discovered"
    inventory = built.provider.inventory()
    assert sorted(inventory) == sorted(cluster_id(n) for n in NAMES)
