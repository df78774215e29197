"""Who may do what: the one pure rule that decides which plugins and Prometheus a spec may use.

docs/operations.md "Who may do what" is the reference for people. Platform admins declare providers
(FleetProvider: a plugin endpoint, its TLS, the namespaces allowed to use it) and metric sources
(MetricSource: a Prometheus address, its token and CA, the namespaces allowed) as cluster-scoped
objects. A ClusterVersion or UpdateRun names them (`spec.providerRef`, `metric.provider.sourceRef`).
Inline endpoints and addresses (`spec.opsEndpoint`, a check's `endpoint` or `address`, inline TLS
Secret refs) are the original operator's manifests: they work in the namespaces the orchestrator's
configuration allows (`AccessPolicy`, by default only its own namespace), and elsewhere only where
they name exactly what an allowed FleetProvider or MetricSource declares.

`check_access` is called, before any plugin is called or any URL fetched, by the UpdateRun
controller, the ClusterVersion controller and the admission webhook. It does no I/O: callers
hand it the namespace's labels (only needed when an allowedNamespaces.selector must be
evaluated; None counts as "no label matches") and the declared objects by name.
It answers either every Problem (field and fix; the spec must then not act) or an `Access`:
the resolved plugin endpoint of the run, of each health check, each Prometheus, and the
namespace whose Secrets each of them may read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from orchestrator import api
from orchestrator.engine.validate import Problem

__all__ = [
    "ALL_NAMESPACES",
    "INLINE_FLAG",
    "Access",
    "AccessPolicy",
    "Composition",
    "Endpoint",
    "Part",
    "PrometheusSource",
    "check_access",
    "needs_labels",
    "parse_inline_namespaces",
]

#: What a platform admin declares in the catalog: a FleetProvider or a MetricSource.
_S = TypeVar("_S", api.FleetProviderSpec, api.MetricSourceSpec)

#: The orchestrator flag that allows inline endpoints in more namespaces.
INLINE_FLAG = "--allow-inline-endpoints-in"
#: In `AccessPolicy.inline_namespaces`: every namespace (unsafe: anyone who can edit a
#: ClusterVersion anywhere can point the orchestrator at any endpoint or URL).
ALL_NAMESPACES = "*"

#: A plugin named by a health check: (endpoint or None for the run's provider, insecure, tls).
PluginKey = tuple[str | None, bool | None, api.TLSConfig | None]


@dataclass(frozen=True)
class AccessPolicy:
    """What the orchestrator's configuration allows beyond FleetProviders and MetricSources."""

    #: The orchestrator's own namespace: FleetProvider and MetricSource Secrets are read here.
    home: str
    #: Namespaces where inline endpoints, addresses and TLS Secret refs are allowed ("*": all).
    inline_namespaces: frozenset[str]

    @classmethod
    def default(cls, home: str) -> AccessPolicy:
        """Inline endpoints only in the orchestrator's own namespace."""
        return cls(home, frozenset({home}))

    def allows_inline(self, namespace: str) -> bool:
        """True when specs in namespace may name endpoints, addresses and Secrets inline."""
        return ALL_NAMESPACES in self.inline_namespaces or namespace in self.inline_namespaces


def parse_inline_namespaces(values: list[str], home: str) -> frozenset[str]:
    """The namespaces of repeated `--allow-inline-endpoints-in NS[,NS]` flags (default: home)."""
    names = {v.strip() for text in values for v in text.split(",") if v.strip()}
    return frozenset(names) if names else frozenset({home})


@dataclass(frozen=True)
class Endpoint:
    """A plugin endpoint a spec may use, with the namespace its TLS Secrets are read in."""

    endpoint: str
    insecure: bool
    tls: api.TLSConfig | None
    secret_namespace: str
    #: Where it came from, for messages: "FleetProvider NAME" or the spec field.
    via: str

    def ops_endpoint(self) -> api.OpsEndpoint:
        """As an OpsEndpoint (what the TLS resolver and the plugin pool take)."""
        return api.OpsEndpoint(endpoint=self.endpoint, insecure=self.insecure, tls=self.tls)

    @property
    def field(self) -> str:
        """The field its TLS settings are at, for messages ("FleetProvider X: spec")."""
        return f"{self.via}: spec" if self.via.startswith("FleetProvider ") else self.via


@dataclass(frozen=True)
class PrometheusSource:
    """A Prometheus a check may query, with the namespace its Secrets are read in."""

    address: str
    bearer_token_secret_ref: api.SecretKeyRef | None
    ca_secret_ref: api.SecretKeyRef | None
    insecure_skip_verify: bool
    secret_namespace: str
    via: str

    @property
    def shown(self) -> str:
        """How status and Events name it: "MetricSource X" (its address is the platform
        admin's, not the tenant's to read), or "" for an address the spec wrote inline."""
        return self.via if self.via.startswith("MetricSource ") else ""


@dataclass(frozen=True)
class Part:
    """One role of a composed provider: its FleetProvider's name and endpoint, the template
    of its cluster ids, and whether spec.parts names it (False: a default: preflight from the
    upgrades part, health from the inventory part)."""

    role: str
    name: str
    endpoint: Endpoint
    template: str
    named: bool


@dataclass(frozen=True)
class Composition:
    """A composed provider (FleetProvider spec.parts): every role's part."""

    name: str
    parts: Mapping[str, Part]


@dataclass(frozen=True)
class Access:
    """What a spec was allowed to use: the run's provider and every check's plugin or source.

    For a composed provider, `provider` is its health part (what a check naming no endpoint
    asks) and `composition` holds every part."""

    provider: Endpoint
    plugins: Mapping[PluginKey, Endpoint] = field(default_factory=dict)
    prometheus: Mapping[api.MetricProvider, PrometheusSource] = field(default_factory=dict)
    #: A run over several FleetProviders (spec.providerRefs): each one's name and endpoint, in
    #: the spec's order (`provider` is the first). Empty for providerRef and opsEndpoint.
    members: tuple[tuple[str, Endpoint], ...] = ()
    composition: Composition | None = None

    def plugin(
        self, endpoint: str | None, insecure: bool | None, tls: api.TLSConfig | None
    ) -> Endpoint:
        """The endpoint a check's plugin fields were allowed to use (KeyError: not checked)."""
        if endpoint is None and insecure is None and tls is None:
            return self.provider
        return self.plugins[(endpoint, insecure, tls)]


def check_access(
    namespace: str,
    spec: api.ClusterVersionSpec | api.UpdateRunSpec,
    providers: Mapping[str, api.FleetProviderSpec | None],
    sources: Mapping[str, api.MetricSourceSpec | None],
    policy: AccessPolicy,
    namespace_labels: Mapping[str, str] | None = None,
) -> Access | list[Problem]:
    """Decide what a spec in namespace may use; every Problem names the field and the fix.

    providers / sources: every FleetProvider / MetricSource by name (None: it exists but its
    spec does not parse). namespace_labels: the namespace's labels, needed only when some
    allowedNamespaces.selector must be evaluated (None: no selector matches).
    """
    rules = _Rules(namespace, providers, sources, policy, namespace_labels)
    provider = rules.provider(spec)
    plugins: dict[PluginKey, Endpoint] = {}
    prometheus: dict[api.MetricProvider, PrometheusSource] = {}
    stages = (spec.strategy.stages if spec.strategy else None) or []
    blocks = [("spec.healthChecks", spec.health_checks)] + [
        (f"spec.strategy.stages[{i}].healthChecks", s.health_checks) for i, s in enumerate(stages)
    ]
    for where, block in blocks:
        for i, check in enumerate(block.checks if block else []):
            at = f"{where}.checks[{i}]"
            if check.metric is not None:
                mp = check.metric.provider
                if mp.type == "prometheus" or mp.source_ref is not None:
                    source = rules.prometheus(f"{at}.metric.provider", mp)
                    if source is not None:
                        prometheus[mp] = source
                    continue
                key: PluginKey = (mp.endpoint, mp.insecure, mp.tls)
                found = rules.check_plugin(f"{at}.metric.provider", key, provider)
            elif check.workloads is not None:
                wl = check.workloads
                key = (wl.endpoint, wl.insecure, wl.tls)
                found = rules.check_plugin(f"{at}.workloads", key, provider)
            else:
                continue
            if found is not None:
                plugins[key] = found
    hooks = spec.strategy.hooks if spec.strategy else None
    for kind, hook in (
        ("preUpgrade", hooks.pre_upgrade if hooks else None),
        ("postUpgrade", hooks.post_upgrade if hooks else None),
    ):
        if hook is not None and hook.http is not None and not rules.inline:
            # The spec (or a Secret of its namespace) chooses the URL the orchestrator calls.
            rules._refuse(
                f"spec.strategy.hooks.{kind}.http",
                f"HTTP hooks call a URL the spec chooses, allowed only where inline endpoints "
                f"are: ask a platform admin for {INLINE_FLAG}={namespace} on the orchestrator, "
                "or use a job hook",
            )
    if rules.problems or provider is None:
        return rules.problems
    return Access(
        provider, plugins, prometheus, members=tuple(rules.members), composition=rules.composition
    )


@dataclass
class _Rules:
    namespace: str
    providers: Mapping[str, api.FleetProviderSpec | None]
    sources: Mapping[str, api.MetricSourceSpec | None]
    policy: AccessPolicy
    labels: Mapping[str, str] | None
    problems: list[Problem] = field(default_factory=list)
    #: spec.providerRefs as allowed: (FleetProvider name, its endpoint).
    members: list[tuple[str, Endpoint]] = field(default_factory=list)
    composition: Composition | None = None

    @property
    def inline(self) -> bool:
        return self.policy.allows_inline(self.namespace)

    def _refuse(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))

    def _how(self, kind: str, ref_field: str, what: str) -> str:
        ns = self.namespace
        return (
            f"name a {kind} that allows namespace {ns} in {ref_field} (kubectl get "
            f"{kind.lower()}s), or ask a platform admin to allow it: a {kind} for {what} whose "
            f"spec.allowedNamespaces lists {ns}, or {INLINE_FLAG}={ns} on the orchestrator"
        )

    # -- the run's provider ----------------------------------------------------------------

    def provider(self, spec: api.ClusterVersionSpec | api.UpdateRunSpec) -> Endpoint | None:
        ref, ops = spec.provider_ref, spec.ops_endpoint
        if spec.provider_refs is not None:
            return self._several(spec.provider_refs, ref is not None, ops is not None)
        if ref is not None and ops is not None:
            self._refuse("spec.providerRef", "set either providerRef or opsEndpoint, not both")
            return None
        if ref is not None:
            return self._declared("spec.providerRef.name", ref.name)
        if ops is None:
            self._refuse(
                "spec.providerRef",
                "is required: name a FleetProvider that allows namespace "
                f"{self.namespace} (kubectl get fleetproviders), or set spec.opsEndpoint "
                "where inline endpoints are allowed",
            )
            return None
        return self._inline("spec.opsEndpoint", ops.endpoint, ops.insecure, ops.tls)

    def _several(self, refs: list[api.ProviderRef], ref: bool, ops: bool) -> Endpoint | None:
        """spec.providerRefs: every FleetProvider checked like providerRef; alone."""
        if ref or ops:
            others = " and ".join(
                f for f, set_ in (("providerRef", ref), ("opsEndpoint", ops)) if set_
            )
            self._refuse(
                "spec.providerRefs",
                f"set one of providerRefs, providerRef or opsEndpoint, not several: remove "
                f"{others} (list that FleetProvider in providerRefs instead)",
            )
            return None
        seen: set[str] = set()
        for i, r in enumerate(refs):
            where = f"spec.providerRefs[{i}].name"
            if r.name in seen:
                self._refuse(where, f"FleetProvider {r.name} is listed twice; list each once")
                continue
            seen.add(r.name)
            declared = self.providers.get(r.name)
            if declared is not None and declared.parts is not None:
                self._refuse(
                    where,
                    f"FleetProvider {r.name} is composed (spec.parts); a run over several "
                    "providers takes FleetProviders with an endpoint: name it alone in "
                    "spec.providerRef, or list FleetProviders with an endpoint here",
                )
                continue
            found = self._declared(where, r.name)
            if found is not None:
                self.members.append((r.name, found))
        if len(self.members) != len(refs):
            return None
        return self.members[0][1]

    def _usable(
        self, where: str, kind: str, name: str, catalog: Mapping[str, _S | None]
    ) -> _S | None:
        """A FleetProvider or MetricSource this namespace may name: it exists, its spec is
        valid and its allowedNamespaces allow the namespace; else refused at where, naming the
        fix."""
        if name not in catalog:
            self._refuse(
                where,
                f"{kind} {name} does not exist; name one that allows namespace "
                f"{self.namespace} (kubectl get {kind.lower()}s) or ask a platform admin to "
                "create it",
            )
            return None
        declared = catalog[name]
        if declared is None:
            self._refuse(
                where,
                f"{kind} {name} has an invalid spec; a platform admin must fix it "
                f"(kubectl get {kind.lower()} {name} -o yaml)",
            )
            return None
        if not declared.allowed_namespaces.allows(self.namespace, self.labels):
            self._refuse(
                where,
                f"{kind} {name} does not allow namespace {self.namespace}; a platform "
                f"admin adds it to spec.allowedNamespaces of {kind} {name}",
            )
            return None
        return declared

    def _declared(self, where: str, name: str) -> Endpoint | None:
        declared = self._usable(where, "FleetProvider", name, self.providers)
        if declared is None:
            return None
        if declared.parts is not None:
            return self._composed(where, name, declared.parts)
        assert declared.endpoint is not None  # FleetProviderSpec: endpoint or parts
        return Endpoint(
            declared.endpoint,
            declared.insecure,
            declared.tls,
            self.policy.home,
            f"FleetProvider {name}",
        )

    def _composed(self, where: str, name: str, parts: api.ProviderParts) -> Endpoint | None:
        """A composed provider's parts (each a FleetProvider with an endpoint; their own
        allowedNamespaces do not matter: the composed one's were checked); the health part's
        endpoint is the run's provider for checks."""
        found: dict[str, Part] = {}
        defaults = {"preflight": "upgrades", "health": "inventory"}
        for role in api.PART_ROLES:
            part = getattr(parts, role)
            named = part is not None
            if part is None:
                part = getattr(parts, defaults[role])
            at = f"FleetProvider {name}: spec.parts.{role}.name"
            declared = self.providers.get(part.name)
            problem = ""
            if part.name not in self.providers:
                problem = f"FleetProvider {part.name} does not exist"
            elif declared is None:
                problem = f"FleetProvider {part.name} has an invalid spec"
            elif declared.endpoint is None:
                problem = f"FleetProvider {part.name} is itself composed; name one with an endpoint"
            if problem or declared is None or declared.endpoint is None:
                self._refuse(where, f"{at}: {problem}; a platform admin must fix it")
                continue
            endpoint = Endpoint(
                declared.endpoint,
                declared.insecure,
                declared.tls,
                self.policy.home,
                f"FleetProvider {part.name}",
            )
            template = part.template if named else getattr(parts, defaults[role]).template
            found[role] = Part(role, part.name, endpoint, template, named)
        if len(found) < len(api.PART_ROLES):
            return None
        self.composition = Composition(name, found)
        return found["health"].endpoint

    def _inline(
        self, where: str, endpoint: str, insecure: bool | None, tls: api.TLSConfig | None
    ) -> Endpoint | None:
        """An endpoint written in the spec: allowed inline, or exactly what a provider declares.

        insecure None (a health check that does not say) takes what the provider declares.
        """
        if self.inline:
            return Endpoint(endpoint, bool(insecure), tls, self.namespace, where)
        for name in sorted(self.providers):
            declared = self.providers[name]
            if (
                declared is None
                or declared.endpoint != endpoint
                or not declared.allowed_namespaces.allows(self.namespace, self.labels)
            ):
                continue
            if tls is not None:
                self._refuse(
                    f"{where}.tls",
                    f"inline TLS Secrets are not read in namespace {self.namespace}; remove "
                    f"tls: FleetProvider {name} supplies the TLS of {endpoint}",
                )
                return None
            if insecure is not None and insecure != declared.insecure:
                self._refuse(
                    f"{where}.insecure",
                    f"FleetProvider {name} serves {endpoint} with insecure: "
                    f"{str(declared.insecure).lower()}; set the same, or use spec.providerRef",
                )
                return None
            return Endpoint(
                declared.endpoint,
                declared.insecure,
                declared.tls,
                self.policy.home,
                f"FleetProvider {name}",
            )
        self._refuse(
            where,
            f"inline plugin endpoints are not allowed in namespace {self.namespace}: "
            + self._how("FleetProvider", "spec.providerRef", endpoint),
        )
        return None

    # -- health checks ---------------------------------------------------------------------

    def check_plugin(
        self, where: str, key: PluginKey, provider: Endpoint | None
    ) -> Endpoint | None:
        endpoint, insecure, tls = key
        if endpoint is not None:
            return self._inline(f"{where}.endpoint", endpoint, insecure, tls)
        if self.members:
            self._refuse(
                f"{where}.endpoint",
                "is required in a run over several FleetProviders (spec.providerRefs): name "
                "the plugin that answers this check (the endpoint of one of them, or another "
                "that a FleetProvider declares)",
            )
            return None
        if provider is None or (insecure is None and tls is None):
            return provider
        if provider.via.startswith("FleetProvider"):
            self._refuse(
                where,
                f"insecure and tls come from {provider.via} when endpoint is not set; remove them",
            )
            return None
        if tls is not None and not self.inline:
            self._refuse(f"{where}.tls", self._secrets_refused())
            return None
        return Endpoint(
            provider.endpoint,
            provider.insecure if insecure is None else insecure,
            tls or provider.tls,
            provider.secret_namespace,
            where,
        )

    def _secrets_refused(self) -> str:
        return (
            f"inline Secret refs are not read in namespace {self.namespace}; use a "
            f"FleetProvider or MetricSource, or ask a platform admin for "
            f"{INLINE_FLAG}={self.namespace}"
        )

    def prometheus(self, where: str, mp: api.MetricProvider) -> PrometheusSource | None:
        inline_secrets = mp.bearer_token_secret_ref is not None or mp.ca_secret_ref is not None
        if mp.source_ref is not None:
            if mp.type != "prometheus":
                self._refuse(f"{where}.type", "sourceRef names a Prometheus; set type: prometheus")
                return None
            if mp.address is not None:
                self._refuse(f"{where}.sourceRef", "set either sourceRef or address, not both")
                return None
            if inline_secrets or mp.insecure_skip_verify:
                self._refuse(
                    f"{where}.sourceRef",
                    f"MetricSource {mp.source_ref.name} supplies the token, CA and TLS "
                    "settings; remove bearerTokenSecretRef, caSecretRef and insecureSkipVerify",
                )
                return None
            return self._source(f"{where}.sourceRef.name", mp.source_ref.name)
        address = mp.address or ""
        if self.inline:
            return PrometheusSource(
                address,
                mp.bearer_token_secret_ref,
                mp.ca_secret_ref,
                mp.insecure_skip_verify,
                self.namespace,
                f"{where}.address",
            )
        for name in sorted(self.sources):
            declared = self.sources[name]
            if (
                declared is None
                or declared.address.rstrip("/") != address.rstrip("/")
                or not declared.allowed_namespaces.allows(self.namespace, self.labels)
            ):
                continue
            if inline_secrets or mp.insecure_skip_verify:
                self._refuse(
                    where,
                    f"MetricSource {name} supplies the token, CA and TLS settings of {address}; "
                    "remove bearerTokenSecretRef, caSecretRef and insecureSkipVerify",
                )
                return None
            return self._source(f"{where}.address", name)
        self._refuse(
            f"{where}.address",
            f"inline Prometheus addresses are not allowed in namespace {self.namespace}: "
            + self._how("MetricSource", "metric.provider.sourceRef", address),
        )
        return None

    def _source(self, where: str, name: str) -> PrometheusSource | None:
        declared = self._usable(where, "MetricSource", name, self.sources)
        if declared is None:
            return None
        return PrometheusSource(
            declared.address,
            declared.bearer_token_secret_ref,
            declared.ca_secret_ref,
            declared.insecure_skip_verify,
            self.policy.home,
            f"MetricSource {name}",
        )


def needs_labels(
    providers: Mapping[str, api.FleetProviderSpec | None],
    sources: Mapping[str, api.MetricSourceSpec | None],
) -> bool:
    """True when some declared object selects namespaces by label (callers then fetch them)."""
    return any(
        p is not None and p.allowed_namespaces.selector is not None
        for p in [*providers.values(), *sources.values()]
    )
