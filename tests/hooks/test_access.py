"""Who may do what, for hooks: an HTTP hook makes the orchestrator call a URL the spec (or a
Secret of its namespace) chooses, so it is allowed only where inline endpoints are; a Job hook
is gated by RBAC (the hook-jobs RoleBinding), not by the access rule."""

from __future__ import annotations

from typing import Any

from orchestrator import api
from orchestrator.engine.access import INLINE_FLAG, Access, AccessPolicy, check_access
from orchestrator.engine.validate import Problem

HOME = "fleet-upgrade-system"
POLICY = AccessPolicy.default(HOME)
PROVIDER = api.FleetProviderSpec.model_validate(
    {"endpoint": "localhost:9090", "allowedNamespaces": {"names": ["team-a"]}}
)


def _spec(hooks: dict[str, Any]) -> api.ClusterVersionSpec:
    return api.ClusterVersionSpec.model_validate(
        {
            "clusters": [{"id": "a", "version": "1.29.4"}],
            "providerRef": {"name": "fleet"},
            "strategy": {"hooks": hooks},
        }
    )


HTTP = {"http": {"urlSecretRef": {"name": "hook", "key": "url"}}}
JOB = {"job": {"template": {"template": {"spec": {"containers": []}}}}}


def test_an_http_hook_outside_the_inline_namespaces_is_refused_with_the_fix() -> None:
    result = check_access("team-a", _spec({"postUpgrade": HTTP}), {"fleet": PROVIDER}, {}, POLICY)
    assert isinstance(result, list)
    found = {p.field: p.message for p in result if isinstance(p, Problem)}
    assert set(found) == {"spec.strategy.hooks.postUpgrade.http"}
    assert f"{INLINE_FLAG}=team-a" in found["spec.strategy.hooks.postUpgrade.http"]


def test_an_http_hook_where_inline_endpoints_are_allowed_passes() -> None:
    allowed = AccessPolicy(HOME, frozenset({HOME, "team-a"}))
    spec = _spec({"preUpgrade": {"http": {"url": "https://hooks.example/pre"}}})
    assert isinstance(check_access("team-a", spec, {"fleet": PROVIDER}, {}, allowed), Access)


def test_a_job_hook_is_not_the_access_rules_business() -> None:
    spec = _spec({"preUpgrade": JOB, "postUpgrade": JOB})
    assert isinstance(check_access("team-a", spec, {"fleet": PROVIDER}, {}, POLICY), Access)
