"""AccessCatalog: the cached FleetProviders feed the access rule, re-read when they change."""

from __future__ import annotations

from typing import Any

from orchestrator import api
from orchestrator.adapters.cache import AccessCatalog
from orchestrator.engine.access import Access, AccessPolicy


def _provider(rv: int, endpoint: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "prod", "resourceVersion": str(rv)},  # cluster-scoped: no namespace
        "spec": {"endpoint": endpoint, "allowedNamespaces": {"names": ["team-a"]}},
    }


def test_the_catalog_follows_declared_providers_by_resource_version() -> None:
    # No selector is declared, so the catalog never asks the apiserver for namespace labels.
    catalog = AccessCatalog(None, AccessPolicy.default("fleet-upgrade-system"))  # type:
    # ignore[arg-type]
    spec = api.ClusterVersionSpec.model_validate(
        {"providerRef": {"name": "prod"}, "clusters": [{"id": "a", "version": "1.29.4"}]}
    )
    catalog.providers.put(_provider(1, "plugin-a:9443"))
    first = catalog.check("team-a", spec)
    assert isinstance(first, Access) and first.provider.endpoint == "plugin-a:9443"
    catalog.providers.put(_provider(2, "plugin-b:9443"))  # the admin moved it
    moved = catalog.check("team-a", spec)
    assert isinstance(moved, Access) and moved.provider.endpoint == "plugin-b:9443"
    catalog.providers.put(_provider(3, "not an endpoint"))  # the CRD schema would refuse this
    broken = catalog.check("team-a", spec)
    assert isinstance(broken, list)
    assert "FleetProvider prod has an invalid spec" in broken[0].message
    catalog.providers.put(_provider(4, "plugin-b:9443"), deleted=True)
    gone = catalog.check("team-a", spec)
    assert isinstance(gone, list) and "does not exist" in gone[0].message
