"""An AKS (Azure Resource Manager) emulator for tests: the Microsoft.ContainerService routes the
AKS plugin uses, served over HTTPS on loopback in ARM's wire format, with long-running
operations, so azure-mgmt-containerservice talks to it unchanged:

    ContainerServiceClient(credential, subscription_id, base_url=emulator.endpoint,
                           connection_verify=emulator.ca_file)

azure-core sends bearer tokens only over https, hence real TLS (tests/support/certs.py). The
emulator accepts one bearer token (emulator.token; emulator.credential() is a TokenCredential
that returns it), and also serves the Entra ID token endpoint a workload identity credential
uses (AZURE_AUTHORITY_HOST = emulator.endpoint, the federated token emulator.federated_token,
client emulator.client_id), answering that bearer token.

Rules (each with its source in _model.py): upgrade profiles (no minor skipping, pools not past
the control plane), one operation at a time per cluster (409 OperationNotAllowed), LRO polling
(Azure-AsyncOperation / Location), throttling (429 + Retry-After), transient 5xx, failed
operations, maintenance configurations, If-Match etags, paging by nextLink.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken

from tests.support.aks_emulator._http import EmulatorServer
from tests.support.aks_emulator._model import ApiError, EmulatorState, Fault, cluster_key
from tests.support.certs import generate_pki

__all__ = ["API_VERSION", "AksEmulator", "ApiError", "Fault", "StaticToken", "split_id"]

API_VERSION = "2026-08-01"
"""The api-version azure-mgmt-containerservice sends by default (its _configuration.py); a test
checks the installed SDK still uses it."""


def split_id(cluster_id: str) -> tuple[str, str, str]:
    """(subscription, resource group, name) of a managed cluster's ARM resource id."""
    parts = cluster_id.strip("/").split("/")
    if len(parts) != 8 or parts[0].lower() != "subscriptions":
        raise ValueError(f"{cluster_id!r} is not a managed cluster resource id")
    return parts[1], parts[3], parts[7]


class StaticToken:
    """A TokenCredential (azure.core.credentials protocol) answering one fixed token."""

    def __init__(self, token: str) -> None:
        self._token = token
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken(self._token, int(time.time()) + 3600)

    def close(self) -> None:
        return None


class AksEmulator:
    """The emulator: state (clusters, versions, faults) and its HTTPS server."""

    def __init__(self, op_seconds: float = 0.5, page_size: int = 2) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="aks-emulator-")
        pki = generate_pki(Path(self._dir.name))
        self.ca_file = pki.ca_file
        self.token = secrets.token_urlsafe(24)
        self.federated_token = f"federated.{secrets.token_urlsafe(24)}"
        self.client_id = "11111111-2222-3333-4444-555555555555"
        self.tenant_id = "99999999-8888-7777-6666-555555555555"
        self.state = EmulatorState(op_seconds=op_seconds)
        self.server = EmulatorServer(
            self.state,
            pki.server.cert_file,
            pki.server.key_file,
            api_version=API_VERSION,
            token=self.token,
            federated_token=self.federated_token,
            client_id=self.client_id,
            page_size=page_size,
        )

    def __enter__(self) -> AksEmulator:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self._dir.cleanup()

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def credential(self) -> StaticToken:
        return StaticToken(self.token)

    # -------------------------------------------------------------- setup

    def set_versions(self, location: str, versions: list[str]) -> None:
        self.state.set_versions(location, versions)

    def add_cluster(self, cluster_id: str, **kwargs: Any) -> str:
        return self.state.add_cluster(*split_id(cluster_id), **kwargs)

    def set_maintenance(self, cluster_id: str, name: str, properties: dict[str, Any]) -> None:
        self.state.set_maintenance(cluster_key(*split_id(cluster_id)), name, properties)

    def fail_next(self, cluster_id: str, fault: Fault | None = None) -> None:
        self.state.fail_next(cluster_key(*split_id(cluster_id)), fault or Fault())

    def throttle(self, count: int, retry_after: int = 1) -> None:
        self.state.throttle(count, retry_after)

    def transient(self, count: int, status: int = 503) -> None:
        self.state.transient(count, status)

    def hold(self, cluster_id: str) -> None:
        self.state.hold(cluster_key(*split_id(cluster_id)))

    def set_state(self, cluster_id: str, state: str) -> None:
        self.state.set_state(cluster_key(*split_id(cluster_id)), state)

    # -------------------------------------------------------------- inspection

    def cluster(self, cluster_id: str) -> dict[str, Any]:
        """The cluster's ARM body now (operations that ended are applied first)."""
        return self.state.snapshot(cluster_key(*split_id(cluster_id)))

    def busy(self, cluster_id: str) -> bool:
        return self.state.in_progress(cluster_key(*split_id(cluster_id)))

    def calls(self, name: str) -> int:
        return sum(1 for n, _ in list(self.state.calls) if n == name)

    def requests(self, name: str) -> list[dict[str, Any] | None]:
        return [b for n, b in list(self.state.calls) if n == name]
