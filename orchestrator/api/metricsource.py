"""The MetricSource kind: a Prometheus a platform admin declares, and whose checks may query it."""

from __future__ import annotations

from pydantic import Field

from orchestrator.api.fields import AllowedNamespaces, SecretKeyRef, _Model

__all__ = ["METRIC_SOURCE_KIND", "METRIC_SOURCE_PLURAL", "MetricSourceSpec"]


METRIC_SOURCE_KIND = "MetricSource"


METRIC_SOURCE_PLURAL = "metricsources"


class MetricSourceSpec(_Model):
    """A Prometheus a platform admin declares, and the namespaces whose checks may query it."""

    address: str = Field(
        pattern=r"^https?://[^/\s]+",
        max_length=2048,
        description="Base URL, e.g. http://prometheus.monitoring:9090.",
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="A bearer token (Secret in the orchestrator's namespace)."
    )
    ca_secret_ref: SecretKeyRef | None = Field(
        default=None, description="CA bundle for https (Secret in the orchestrator's namespace)."
    )
    insecure_skip_verify: bool = Field(default=False, description="Skip TLS verification.")
    allowed_namespaces: AllowedNamespaces = Field(
        description="Who may name this source in metric.provider.sourceRef (nobody when empty)."
    )
