"""Health checks evaluated for real: Prometheus queries, plugin QueryMetric and CheckWorkloads."""

from __future__ import annotations

import json
import math
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetupgrade.plugin.v1 import health_pb2
from orchestrator import api
from orchestrator.engine.health import args as template_args
from orchestrator.engine.health import render
from orchestrator.engine.observations import ClusterObs
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.endpoint_errors import (
    Failure,
    classify_exception,
    display_address,
    log_raw,
    plugin_error_message,
    url_secrets,
)

__all__ = ["Analyzer", "MetricValue", "PrometheusError", "PrometheusTarget"]

#: Resolves a plugin client: (endpoint or None for opsEndpoint, insecure, tls) → client.
ClientFor = Callable[[str | None, bool | None, api.TLSConfig | None], PluginClient]
#: Reads a Secret key of the ClusterVersion's namespace.
SecretReader = Callable[[api.SecretKeyRef], bytes]


@dataclass(frozen=True)
class PrometheusTarget:
    """Where a prometheus check queries, with its token and CA already read.

    name is what status and Events call it ("MetricSource team-prom"): a MetricSource's address
    is the platform admin's, never shown to the namespace using it.
    """

    address: str
    token: bytes | None = None
    ca: bytes | None = None
    insecure_skip_verify: bool = False
    name: str = ""

    @property
    def shown(self) -> str:
        """The kind and name of the endpoint, as tenants read it."""
        return self.name or f"Prometheus {display_address(self.address)}"


#: Resolves a prometheus metric provider (inline address or sourceRef) to its target.
PrometheusFor = Callable[[api.MetricProvider], PrometheusTarget]
_HEALTH = {
    health_pb2.WORKLOAD_HEALTH_HEALTHY: "HEALTHY",
    health_pb2.WORKLOAD_HEALTH_UNHEALTHY: "UNHEALTHY",
    health_pb2.WORKLOAD_HEALTH_MISSING: "MISSING",
    health_pb2.WORKLOAD_HEALTH_UNKNOWN: "UNKNOWN",
}


class PrometheusError(Exception):
    """The query could not be answered (unreachable, bad response, several series); the text
    is safe for a status (endpoint_errors' fixed words, never what the endpoint said)."""


@dataclass(frozen=True)
class MetricValue:
    """One number, or no data."""

    value: float | None
    message: str = ""


def query_prometheus(target: PrometheusTarget, query: str, timeout: float = 10.0) -> MetricValue:
    """Run an instant query; exactly one series (or a scalar) is one value, none is no data.

    A failure raises PrometheusError in endpoint_errors' fixed words, naming target.shown; what
    the Prometheus answered goes to the log only, redacted (the token we sent masked).
    """
    address, token, ca = target.address, target.token, target.ca
    url = address.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", "Bearer " + token.decode().strip())
    sent: list[str | bytes] = [*url_secrets(address), *([token] if token else [])]

    def failed(failure: Failure, raw: str | bytes) -> PrometheusError:
        log_raw(f"health query to {target.shown}", failure, raw, sent)
        return PrometheusError(failure.describe("", target.shown))

    context = None
    if url.startswith("https://"):
        try:
            context = ssl.create_default_context(cadata=ca.decode() if ca else None)
        except (ssl.SSLError, ValueError):
            bad_ca = Failure("", "its CA bundle is not valid PEM", "fix the CA Secret it names")
            raise PrometheusError(bad_ca.describe("", target.shown)) from None
        if target.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            raw = response.read(_ANSWER_LIMIT)
    except urllib.error.HTTPError as err:
        with err:
            raw_error = err.read(_ANSWER_LIMIT)
        raise failed(classify_exception(err, "query"), raw_error) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise failed(classify_exception(err, "query"), f"{type(err).__name__}: {err}") from None
    try:
        return _value(json.loads(raw))
    except PrometheusError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
        raise failed(classify_exception(ValueError(err), "query"), raw) from None


#: Bytes of a Prometheus answer read (an instant query with one series is far smaller).
_ANSWER_LIMIT = 4 << 20


def _value(body: dict[str, Any]) -> MetricValue:
    """The one value of an instant query's JSON answer."""
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result") or []
    if kind == "scalar":
        number = float(result[1])
    elif kind == "vector":
        if not result:
            return MetricValue(None, "query returned no data")
        if len(result) > 1:
            raise PrometheusError(f"query returned {len(result)} series; aggregate it to one")
        number = float(result[0]["value"][1])
    else:
        raise PrometheusError("query returned no instant value; write an instant query with one")
    if math.isnan(number):
        return MetricValue(None, "query returned NaN")
    return MetricValue(number)


class Analyzer:
    """Evaluates a healthChecks block on one cluster or on every cluster of a stage."""

    def __init__(
        self,
        client_for: ClientFor,
        read_secret: SecretReader,
        prometheus_for: PrometheusFor | None = None,
    ) -> None:
        self.client_for = client_for
        self.read_secret = read_secret
        #: None: the provider's inline address and Secret refs (read with read_secret).
        self.prometheus_for = prometheus_for or self._inline_prometheus

    def _inline_prometheus(self, provider: api.MetricProvider) -> PrometheusTarget:
        assert provider.address is not None  # validated
        token = (
            self.read_secret(provider.bearer_token_secret_ref)
            if provider.bearer_token_secret_ref
            else None
        )
        ca = self.read_secret(provider.ca_secret_ref) if provider.ca_secret_ref else None
        return PrometheusTarget(provider.address, token, ca, provider.insecure_skip_verify)

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        """One result per check; a check passes only where it passes on every cluster."""
        results = []
        for check in checks.checks:
            if check.metric is not None:
                results.append(self._metric(check.name, check.metric, clusters, stage))
            elif check.workloads is not None:
                results.append(self._workloads(check.name, check.workloads, clusters))
        return results

    def _metric(
        self, name: str, metric: api.MetricCheck, clusters: Sequence[ClusterObs], stage: str
    ) -> api.CheckResult:
        per_cluster = "cluster" in metric.query or "labels." in metric.query
        targets = clusters if per_cluster else clusters[:1]
        worst: api.CheckResult | None = None
        for cluster in targets:
            try:
                value = self._query(metric, cluster, stage)
            except PrometheusError as err:
                return api.CheckResult(
                    name=name, passed=False, message=_where(cluster, per_cluster, str(err))
                )
            except PluginCallError as err:
                return api.CheckResult(
                    name=name, passed=False, message=_where(cluster, per_cluster, _plugin(err))
                )
            result = _verdict(name, metric, value)
            if not result.passed:
                return result.model_copy(
                    update={"message": _where(cluster, per_cluster, result.message or "")}
                )
            worst = worst or result
        return worst or api.CheckResult(name=name, passed=False, message="no cluster to query")

    def _query(self, metric: api.MetricCheck, cluster: ClusterObs, stage: str) -> MetricValue:
        provider = metric.provider
        labels = dict(cluster.labels)
        if provider.type == "prometheus":
            target = self.prometheus_for(provider)
            return query_prometheus(target, render(metric.query, cluster.id, stage, labels))
        client = self.client_for(provider.endpoint, provider.insecure, provider.tls)
        answer = client.query_metric(
            metric.query, template_args(cluster.id, stage, labels), cluster.id
        )
        if not answer.has_data:
            return MetricValue(None, answer.message or "query returned no data")
        return MetricValue(answer.value)

    def _workloads(
        self, name: str, check: api.WorkloadsCheck, clusters: Sequence[ClusterObs]
    ) -> api.CheckResult:
        workloads = [
            health_pb2.Workload(
                namespace=w.namespace,
                name=w.name,
                kind=w.kind or "",
                min_healthy_replicas=w.min_healthy_replicas or 0,
            )
            for w in check.items
        ]
        try:
            client = self.client_for(check.endpoint, check.insecure, check.tls)
            answers = client.check_workloads([c.id for c in clusters], workloads)
        except PluginCallError as err:
            return api.CheckResult(name=name, passed=False, message=_plugin(err))
        bad = [a for a in answers if a.health != health_pb2.WORKLOAD_HEALTH_HEALTHY]
        if bad or not answers:
            shown = (
                ", ".join(
                    f"{a.cluster_id} {a.workload.namespace}/{a.workload.name}: "
                    f"{_HEALTH.get(a.health, 'UNKNOWN')}" + (f" ({a.message})" if a.message else "")
                    for a in bad[:5]
                )
                or "no result"
            )
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            return api.CheckResult(
                name=name, passed=False, value=float(len(answers) - len(bad)), message=shown + more
            )
        return api.CheckResult(
            name=name,
            passed=True,
            value=float(len(answers)),
            message=f"{len(answers)} workload(s) healthy",
        )


def _verdict(name: str, metric: api.MetricCheck, value: MetricValue) -> api.CheckResult:
    if value.value is None:
        passed = metric.no_data_policy == "Pass"
        return api.CheckResult(
            name=name,
            passed=passed,
            message=value.message
            + (" (noDataPolicy: Pass)" if passed else " (noDataPolicy: Fail)"),
        )
    low, high = metric.threshold_range.min, metric.threshold_range.max
    inside = (low is None or value.value >= low) and (high is None or value.value <= high)
    bounds = f"[{'-∞' if low is None else f'{low:g}'}, {'∞' if high is None else f'{high:g}'}]"
    verb = "within" if inside else "outside"
    return api.CheckResult(
        name=name,
        passed=inside,
        value=value.value,
        message=f"value {value.value:g} {verb} {bounds}",
    )


def _plugin(err: PluginCallError) -> str:
    where = f"{err.plugin} {err.rpc}" if err.plugin else err.rpc
    return f"{where}: {plugin_error_message(err, named=False)}"


def _where(cluster: ClusterObs, per_cluster: bool, message: str) -> str:
    return f"{cluster.id}: {message}" if per_cluster else message
