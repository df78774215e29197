"""TLS material and Secret keys a spec refers to, read from the object's own namespace."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import api
from orchestrator.adapters.kube import KubeClient, KubeError, NotFound
from plugins.sdk.client import ClientTLS

__all__ = ["SecretError", "TLSResolver"]


class SecretError(Exception):
    """A referenced Secret or key is missing; the message names the field and the fix."""


@dataclass
class TLSResolver:
    """Reads the Secrets a ClusterVersion or UpdateRun names (and only those)."""

    kube: KubeClient

    def client_tls(self, namespace: str, endpoint: api.OpsEndpoint, field: str) -> ClientTLS | None:
        """TLS towards a plugin endpoint (None for plaintext), from the referenced Secrets."""
        if endpoint.insecure:
            return None
        tls = endpoint.tls or api.TLSConfig()
        ca = cert = key = None
        try:
            if tls.ca_secret_ref is not None:
                ca = self.secret_key(namespace, tls.ca_secret_ref, f"{field}.tls.caSecretRef")
            if tls.client_secret_name:
                data = self.kube.read_secret(namespace, tls.client_secret_name)
                if "tls.crt" not in data or "tls.key" not in data:
                    raise SecretError(
                        f"{field}.tls.clientSecretName: Secret {tls.client_secret_name} "
                        "needs keys tls.crt and tls.key"
                    )
                cert, key = data["tls.crt"], data["tls.key"]
        except NotFound as err:
            raise SecretError(f"{field}.tls: a referenced Secret is missing ({err})") from err
        except KubeError as err:
            raise _refused(err, namespace, f"{field}.tls") from err
        return ClientTLS.from_pem(ca, cert, key, server_name=tls.server_name)

    def secret_key(self, namespace: str, ref: api.SecretKeyRef, field: str) -> bytes:
        """One key of one Secret; SecretError names the field when it is missing."""
        try:
            data = self.kube.read_secret(namespace, ref.name)
        except NotFound as err:
            raise SecretError(f"{field}: Secret {ref.name} does not exist") from err
        except KubeError as err:
            raise _refused(err, namespace, field) from err
        if ref.key not in data:
            raise SecretError(f"{field}: Secret {ref.name} has no key {ref.key}")
        return data[ref.key]


def _refused(err: KubeError, namespace: str, field: str) -> Exception:
    """A 403 as a SecretError that says how to allow it; any other error unchanged."""
    if err.status != 403:
        return err
    return SecretError(
        f"{field}: the orchestrator may not read Secrets in namespace {namespace}; use a "
        "FleetProvider or MetricSource (Secrets in the orchestrator's namespace), or bind the "
        f"ClusterRole fleet-orchestrator-tls-secrets in {namespace} "
        "(manifests/overlays/inline-tls-secrets)"
    )
