"""The pure access rule (orchestrator.engine.access.check_access): who may use which plugin and
URL."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator import api
from orchestrator.engine.access import (
    INLINE_FLAG,
    Access,
    AccessPolicy,
    check_access,
    needs_labels,
    parse_inline_namespaces,
)
from orchestrator.engine.validate import Problem

HOME = "fleet-upgrade-system"
POLICY = AccessPolicy.default(HOME)
SIDECAR = "localhost:9090"


def cv(**spec: Any) -> api.ClusterVersionSpec:
    body: dict[str, Any] = {"clusters": [{"id": "a", "version": "1.29.4"}], **spec}
    return api.ClusterVersionSpec.model_validate(body)


def provider(endpoint: str = SIDECAR, **spec: Any) -> api.FleetProviderSpec:
    spec.setdefault("allowedNamespaces", {"names": ["team-a"]})
    return api.FleetProviderSpec.model_validate({"endpoint": endpoint, **spec})


def source(address: str = "http://prometheus.monitoring:9090", **spec: Any) -> api.MetricSourceSpec:
    spec.setdefault("allowedNamespaces", {"names": ["team-a"]})
    return api.MetricSourceSpec.model_validate({"address": address, **spec})


def checks(*items: dict[str, Any]) -> dict[str, Any]:
    return {"checks": list(items)}


def metric(name: str = "errors", **provider_fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "metric": {
            "provider": provider_fields,
            "query": "sum(rate(errors[5m]))",
            "thresholdRange": {"max": 1},
        },
    }


def problems(result: Access | list[Problem]) -> dict[str, str]:
    assert isinstance(result, list), f"expected a refusal, got {result}"
    assert result, "a refusal lists at least one problem"
    return {p.field: p.message for p in result}


def allowed(result: Access | list[Problem]) -> Access:
    assert isinstance(result, Access), f"refused: {result}"
    return result


# -- the run's provider ------------------------------------------------------------------------


def test_inline_ops_endpoint_works_in_the_orchestrators_namespace_only_by_default() -> None:
    spec = cv(opsEndpoint={"endpoint": SIDECAR, "insecure": True})
    access = allowed(check_access(HOME, spec, {}, {}, POLICY))
    assert access.provider.endpoint == SIDECAR and access.provider.insecure
    assert access.provider.secret_namespace == HOME
    refused = problems(check_access("team-a", spec, {}, {}, POLICY))
    message = refused["spec.opsEndpoint"]
    assert "not allowed in namespace team-a" in message
    assert f"{INLINE_FLAG}=team-a" in message  # how to allow it: the flag ...
    assert "FleetProvider" in message and "spec.providerRef" in message  # ... or a provider


def test_the_flag_allows_listed_namespaces_and_star_allows_all() -> None:
    spec = cv(opsEndpoint={"endpoint": SIDECAR, "insecure": True, "tls": None})
    listed = AccessPolicy(HOME, parse_inline_namespaces(["team-a,team-b", "team-c"], HOME))
    for ns in ("team-a", "team-b", "team-c"):
        assert allowed(check_access(ns, spec, {}, {}, listed)).provider.secret_namespace == ns
    assert problems(check_access(HOME, spec, {}, {}, listed))  # the flag replaces the default
    everyone = AccessPolicy(HOME, parse_inline_namespaces(["*"], HOME))
    assert allowed(check_access("anything", spec, {}, {}, everyone))
    assert parse_inline_namespaces([], HOME) == frozenset({HOME})


def test_provider_ref_resolves_to_the_declared_endpoint_and_home_secrets() -> None:
    tls = {"caSecretRef": {"name": "plugin-ca", "key": "ca.crt"}, "clientSecretName": "client"}
    fp = provider("plugin.fleet:9443", tls=tls)
    spec = cv(providerRef={"name": "prod"})
    access = allowed(check_access("team-a", spec, {"prod": fp}, {}, POLICY))
    assert access.provider.endpoint == "plugin.fleet:9443" and not access.provider.insecure
    assert access.provider.tls == fp.tls
    assert access.provider.secret_namespace == HOME  # never the team's namespace
    assert access.provider.field == "FleetProvider prod: spec"


def test_provider_ref_refusals_name_the_field_and_the_fix() -> None:
    spec = cv(providerRef={"name": "prod"})
    missing = problems(check_access("team-a", spec, {}, {}, POLICY))
    assert "FleetProvider prod does not exist" in missing["spec.providerRef.name"]
    invalid = problems(check_access("team-a", spec, {"prod": None}, {}, POLICY))
    assert "invalid spec" in invalid["spec.providerRef.name"]
    other = problems(check_access("team-b", spec, {"prod": provider()}, {}, POLICY))
    assert other["spec.providerRef.name"] == (
        "FleetProvider prod does not allow namespace team-b; a platform admin adds it to "
        "spec.allowedNamespaces of FleetProvider prod"
    )
    nobody = provider(allowedNamespaces={})
    assert problems(check_access(HOME, spec, {"prod": nobody}, {}, POLICY))


def test_exactly_one_of_provider_ref_and_ops_endpoint() -> None:
    both = cv(providerRef={"name": "prod"}, opsEndpoint={"endpoint": SIDECAR})
    assert (
        "not both"
        in problems(check_access(HOME, both, {"prod": provider()}, {}, POLICY))["spec.providerRef"]
    )
    neither = cv()
    assert (
        "is required" in problems(check_access(HOME, neither, {}, {}, POLICY))["spec.providerRef"]
    )


def test_namespace_selector_needs_the_namespaces_labels() -> None:
    fp = provider(allowedNamespaces={"selector": {"matchLabels": {"fleet/tier": "prod"}}})
    spec = cv(providerRef={"name": "prod"})
    assert needs_labels({"prod": fp}, {}) and not needs_labels({"prod": provider()}, {})
    assert allowed(check_access("team-x", spec, {"prod": fp}, {}, POLICY, {"fleet/tier": "prod"}))
    assert problems(check_access("team-x", spec, {"prod": fp}, {}, POLICY, {"fleet/tier": "dev"}))
    assert problems(check_access("team-x", spec, {"prod": fp}, {}, POLICY, None))  # unknown
    anyone = provider(allowedNamespaces={"selector": {}})  # empty selector: every namespace
    assert allowed(check_access("team-y", spec, {"prod": anyone}, {}, POLICY, {}))


def test_original_manifest_works_where_a_provider_declares_its_endpoint() -> None:
    """An unchanged original manifest (inline opsEndpoint) in a team namespace works when a
    FleetProvider declares exactly that endpoint for the namespace; TLS comes from the
    provider (home Secrets), never from the team's namespace."""
    fp = provider(SIDECAR, insecure=True)
    spec = cv(opsEndpoint={"endpoint": SIDECAR, "insecure": True})
    access = allowed(check_access("team-a", spec, {"sidecar": fp}, {}, POLICY))
    assert access.provider.via == "FleetProvider sidecar"
    assert access.provider.secret_namespace == HOME
    assert problems(check_access("team-b", spec, {"sidecar": fp}, {}, POLICY))
    tls_spec = cv(opsEndpoint={"endpoint": SIDECAR, "tls": {"clientSecretName": "mine"}})
    refused = problems(check_access("team-a", tls_spec, {"sidecar": fp}, {}, POLICY))
    assert "inline TLS Secrets are not read" in refused["spec.opsEndpoint.tls"]
    plain = cv(opsEndpoint={"endpoint": SIDECAR, "insecure": False})
    mismatch = problems(check_access("team-a", plain, {"sidecar": fp}, {}, POLICY))
    assert "insecure: true" in mismatch["spec.opsEndpoint.insecure"]


# -- health checks -----------------------------------------------------------------------------


def test_inline_prometheus_address_is_refused_outside_allowed_namespaces() -> None:
    spec = cv(
        providerRef={"name": "prod"},
        healthChecks=checks(metric(type="prometheus", address="http://169.254.169.254:80")),
    )
    refused = problems(check_access("team-a", spec, {"prod": provider()}, {}, POLICY))
    message = refused["spec.healthChecks.checks[0].metric.provider.address"]
    assert "inline Prometheus addresses are not allowed in namespace team-a" in message
    assert "metric.provider.sourceRef" in message and f"{INLINE_FLAG}=team-a" in message


def test_inline_prometheus_in_an_allowed_namespace_reads_its_own_secrets() -> None:
    mp = {
        "type": "prometheus",
        "address": "https://prom.local:9090",
        "bearerTokenSecretRef": {"name": "prom", "key": "token"},
    }
    spec = cv(opsEndpoint={"endpoint": SIDECAR}, healthChecks=checks(metric(**mp)))
    access = allowed(check_access(HOME, spec, {}, {}, POLICY))
    (target,) = access.prometheus.values()
    assert target.address == "https://prom.local:9090"
    assert target.secret_namespace == HOME and target.bearer_token_secret_ref is not None


def test_source_ref_resolves_to_the_declared_prometheus() -> None:
    ms = source(bearerTokenSecretRef={"name": "prom-token", "key": "token"})
    stage_checks = checks(metric(type="prometheus", sourceRef={"name": "central"}))
    spec = cv(
        providerRef={"name": "prod"},
        version="1.29.4",
        strategy={"stages": [{"name": "canary", "clusters": ["a"], "healthChecks": stage_checks}]},
    )
    access = allowed(check_access("team-a", spec, {"prod": provider()}, {"central": ms}, POLICY))
    mp = spec.strategy.stages[0].health_checks.checks[0].metric.provider  # type: ignore[union-attr]
    target = access.prometheus[mp]
    assert target.address == ms.address and target.secret_namespace == HOME
    assert target.bearer_token_secret_ref == ms.bearer_token_secret_ref
    refused = problems(
        check_access(
            "team-b",
            spec,
            {"prod": provider(allowedNamespaces={"names": ["team-b"]})},
            {"central": ms},
            POLICY,
        )
    )
    where = "spec.strategy.stages[0].healthChecks.checks[0].metric.provider.sourceRef.name"
    assert "MetricSource central does not allow namespace team-b" in refused[where]


def test_source_ref_misuse_is_refused() -> None:
    ms = {"central": source()}
    fp = {"prod": provider()}
    cases = {
        "spec.healthChecks.checks[0].metric.provider.sourceRef": metric(
            type="prometheus", sourceRef={"name": "central"}, address="http://x:1"
        ),
        "spec.healthChecks.checks[0].metric.provider.type": metric(
            type="plugin", sourceRef={"name": "central"}
        ),
    }
    for field, check in cases.items():
        spec = cv(providerRef={"name": "prod"}, healthChecks=checks(check))
        assert field in problems(check_access("team-a", spec, fp, ms, POLICY)), field
    secrets = metric(
        type="prometheus", sourceRef={"name": "central"}, caSecretRef={"name": "c", "key": "k"}
    )
    spec = cv(providerRef={"name": "prod"}, healthChecks=checks(secrets))
    refused = problems(check_access("team-a", spec, fp, ms, POLICY))
    assert (
        "supplies the token, CA and TLS"
        in refused["spec.healthChecks.checks[0].metric.provider.sourceRef"]
    )
    missing = cv(
        providerRef={"name": "prod"},
        healthChecks=checks(metric(type="prometheus", sourceRef={"name": "nope"})),
    )
    assert (
        "MetricSource nope does not exist"
        in problems(check_access("team-a", missing, fp, ms, POLICY))[
            "spec.healthChecks.checks[0].metric.provider.sourceRef.name"
        ]
    )


def test_inline_address_matching_a_declared_source_uses_the_source() -> None:
    ms = source(
        "http://prometheus.monitoring:9090/", bearerTokenSecretRef={"name": "t", "key": "k"}
    )
    spec = cv(
        providerRef={"name": "prod"},
        healthChecks=checks(metric(type="prometheus", address="http://prometheus.monitoring:9090")),
    )
    access = allowed(check_access("team-a", spec, {"prod": provider()}, {"central": ms}, POLICY))
    (target,) = access.prometheus.values()
    assert target.via == "MetricSource central" and target.secret_namespace == HOME


def test_check_plugin_endpoints_follow_the_same_rule() -> None:
    fp = {"prod": provider()}
    workloads = {"name": "apps", "workloads": {"items": [{"namespace": "web", "name": "api"}]}}
    default = cv(providerRef={"name": "prod"}, healthChecks=checks(workloads))
    access = allowed(check_access("team-a", default, fp, {}, POLICY))
    assert access.plugin(None, None, None) == access.provider  # no endpoint: the run's provider
    elsewhere = {**workloads, "workloads": {**workloads["workloads"], "endpoint": "evil:1"}}
    spec = cv(providerRef={"name": "prod"}, healthChecks=checks(elsewhere))
    refused = problems(check_access("team-a", spec, fp, {}, POLICY))
    assert (
        "not allowed in namespace team-a"
        in refused["spec.healthChecks.checks[0].workloads.endpoint"]
    )
    override = {**workloads, "workloads": {**workloads["workloads"], "insecure": True}}
    spec = cv(providerRef={"name": "prod"}, healthChecks=checks(override))
    refused = problems(check_access("team-a", spec, fp, {}, POLICY))
    assert "come from FleetProvider prod" in refused["spec.healthChecks.checks[0].workloads"]
    plugin_metric = metric(type="plugin", endpoint="other:9090", insecure=True)
    spec = cv(
        opsEndpoint={"endpoint": SIDECAR, "insecure": True}, healthChecks=checks(plugin_metric)
    )
    access = allowed(check_access(HOME, spec, {}, {}, POLICY))
    assert access.plugin("other:9090", True, None).endpoint == "other:9090"


def test_update_runs_are_checked_like_cluster_versions() -> None:
    run = api.UpdateRunSpec.model_validate(
        {"opsEndpoint": {"endpoint": SIDECAR, "insecure": True}, "clusters": []}
    )
    assert "spec.opsEndpoint" in problems(check_access("team-a", run, {}, {}, POLICY))
    by_ref = run.model_copy(
        update={"ops_endpoint": None, "provider_ref": api.ProviderRef(name="p")}
    )
    assert allowed(check_access("team-a", by_ref, {"p": provider()}, {}, POLICY))


_NS = st.sampled_from(["team-a", "team-b", "team-c", HOME])


@given(
    namespace=_NS,
    inline=st.frozensets(_NS, max_size=3),
    declared=st.dictionaries(
        st.sampled_from(["p1", "p2"]),
        st.tuples(st.sampled_from([SIDECAR, "other:1"]), st.frozensets(_NS, max_size=3)),
        max_size=2,
    ),
    use_ref=st.sampled_from([None, "p1", "p2"]),
)
def test_a_spec_is_allowed_exactly_when_the_admin_allowed_its_namespace(
    namespace: str,
    inline: frozenset[str],
    declared: dict[str, tuple[str, frozenset[str]]],
    use_ref: str | None,
) -> None:
    policy = AccessPolicy(HOME, inline)
    providers = {
        name: provider(ep, insecure=True, allowedNamespaces={"names": sorted(names)})
        for name, (ep, names) in declared.items()
    }
    if use_ref is None:
        spec = cv(opsEndpoint={"endpoint": SIDECAR, "insecure": True})
        expected = namespace in inline or any(
            ep == SIDECAR and namespace in names for ep, names in declared.values()
        )
    else:
        spec = cv(providerRef={"name": use_ref})
        expected = use_ref in declared and namespace in declared[use_ref][1]
    result = check_access(namespace, spec, providers, {}, policy)
    assert isinstance(result, Access) == expected, result
    if isinstance(result, Access):
        # Secrets are read where the admin's decision put them: the team's own namespace only
        # for inline endpoints it may use, the orchestrator's namespace for declared providers.
        own = result.provider.via == "spec.opsEndpoint"
        assert result.provider.secret_namespace == (namespace if own else HOME)
