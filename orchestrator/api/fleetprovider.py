"""The FleetProvider kind: a provider plugin a platform admin declares, and who may use it."""

from __future__ import annotations

from pydantic import Field

from orchestrator.api.fields import ENDPOINT_PATTERN, AllowedNamespaces, TLSConfig, _Model

__all__ = ["FLEET_PROVIDER_KIND", "FLEET_PROVIDER_PLURAL", "FleetProviderSpec"]


FLEET_PROVIDER_KIND = "FleetProvider"


FLEET_PROVIDER_PLURAL = "fleetproviders"


class FleetProviderSpec(_Model):
    """A provider plugin a platform admin declares, and the namespaces that may use it."""

    endpoint: str = Field(pattern=ENDPOINT_PATTERN, description="host:port or unix:/path.")
    insecure: bool = Field(default=False, description="true: plaintext gRPC; false: TLS.")
    tls: TLSConfig | None = Field(
        default=None, description="TLS; its Secrets are read in the orchestrator's namespace."
    )
    allowed_namespaces: AllowedNamespaces = Field(
        description="Who may name this provider in spec.providerRef (nobody when empty)."
    )
