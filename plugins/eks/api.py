"""The EKS API through boto3: one client per region, every call's errors turned into the
contract's (docs/plugins/eks.md, "Errors"), EKS's own words logged redacted, never answered."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from plugins.eks.config import EksConfig
from plugins.sdk import (
    FailedPrecondition,
    Failure,
    NotFound,
    PluginError,
    Reason,
    Unavailable,
    log_raw,
)

__all__ = ["TRANSIENT", "EksApi", "InUse"]

_LOG = logging.getLogger("plugins.eks.api")

TRANSIENT = frozenset(
    {
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ServerException",
        "ServiceUnavailableException",
        "InternalFailure",
        "Throttling",  # Route 53
        "PriorRequestNotComplete",  # Route 53: "the previous request has not been processed"
    }
)
"""Error codes that a later attempt of the same call can pass (service-2.json: Throttling 429,
ServerException 500, ServiceUnavailableException 503)."""

_DENIED = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
    }
)
INVALID_REQUEST_RETRY_SECONDS = 60.0
"""InvalidRequestException is "invalid given the state of the cluster": asked again this
much later (the state may change), unlike InvalidParameterException (never as asked)."""


class InUse(PluginError):
    """EKS answered ResourceInUseException: an update runs on the cluster or node group. The
    caller names that update in a Conflict (ABORTED); it is never answered as such."""


def client_config(config: EksConfig) -> botocore.config.Config:
    """botocore's settings for every client of the plugin: standard retries (throttling and 5xx
    with backoff, maxAttempts in all), the configured timeouts, a user agent naming the plugin."""
    return botocore.config.Config(
        retries={"mode": "standard", "total_max_attempts": config.api.max_attempts},
        connect_timeout=config.api.timeout_seconds,
        read_timeout=config.api.timeout_seconds,
        user_agent_extra="fleet-plugin-eks",
    )


def call(client: Any, where: str, operation: str, what: str = "", **params: Any) -> dict[str, Any]:
    """One AWS call (operation in boto3's snake_case); PluginError on failure. where names the
    service and region for messages ("EKS ... in us-east-1"); what names the resource for
    NOT_FOUND ("cluster", "node group", "update")."""
    label = f"{where.split(' ', 1)[0]} {operation}"
    if " " in where:
        label += f" in {where.split(' ', 1)[1]}"
    try:
        answer: dict[str, Any] = getattr(client, operation)(**params)
    except botocore.exceptions.ClientError as exc:
        raise _mapped(label, what, exc) from None
    except botocore.exceptions.NoCredentialsError:
        raise Unavailable(
            "no AWS credentials found: boto3's default chain (environment, IRSA web "
            "identity, EKS Pod Identity, instance profile) gave none; see "
            "docs/plugins/eks.md, Credentials"
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        failure = Failure("", "unreachable")
        log_raw(label, failure, type(exc).__name__, logger=_LOG)
        raise Unavailable(f"{label}: unreachable", retry_after=0) from None
    answer.pop("ResponseMetadata", None)
    return answer


class EksApi:
    """boto3 EKS clients of the configured regions, credentials from boto3's default chain."""

    def __init__(self, config: EksConfig, session: boto3.session.Session | None = None) -> None:
        self.session = session if session is not None else boto3.session.Session()
        self._clients: dict[str, Any] = {
            region: self.session.client(
                "eks",
                region_name=region,
                endpoint_url=config.api.endpoint or None,
                config=client_config(config),
            )
            for region in config.regions
        }

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def call(self, region: str, operation: str, what: str = "", **params: Any) -> dict[str, Any]:
        """One EKS call in region (see call())."""
        return call(self._clients[region], f"EKS {region}", operation, what, **params)

    def pages(
        self, region: str, operation: str, key: str, what: str = "", **params: Any
    ) -> Iterator[Any]:
        """Every item of a paged list (nextToken), in EKS's order."""
        token = ""
        while True:
            extra = {"nextToken": token} if token else {}
            page = self.call(region, operation, what, **params, **extra)
            yield from page.get(key, [])
            token = page.get("nextToken") or ""
            if not token:
                return


def _mapped(where: str, what: str, exc: botocore.exceptions.ClientError) -> PluginError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", "")) or "Unknown"
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    words = f"{code} (HTTP {status})" if status else code
    log_raw(where, Failure(code, words), str(error.get("Message", "")), logger=_LOG)
    if code == "ResourceInUseException":
        return InUse(f"{where}: {words}")
    if code == "ResourceNotFoundException":
        reason = {
            "cluster": Reason.CLUSTER_NOT_FOUND,
            "node group": Reason.NODE_POOL_NOT_FOUND,
            "update": Reason.OPERATION_NOT_FOUND,
        }.get(what, Reason.NOT_FOUND)
        return NotFound(f"{where}: {what or 'resource'} not found", reason=reason)
    if code in TRANSIENT or status >= 500:
        return Unavailable(f"{where}: {words}; retry later", retry_after=0)
    if code in _DENIED or status == 403:
        return FailedPrecondition(
            f"{where}: denied, {words}; grant the plugin's IAM role the actions of "
            "manifests/eks/iam-policy.json"
        )
    if code == "InvalidStateException":
        return FailedPrecondition(
            f"{where}: EKS upgrade readiness checks failed, {words}; see the cluster's "
            "upgrade insights (aws eks list-insights)",
            retry_after=INVALID_REQUEST_RETRY_SECONDS,
        )
    if code == "InvalidRequestException":
        return FailedPrecondition(
            f"{where}: refused in the cluster's current state, {words}",
            retry_after=INVALID_REQUEST_RETRY_SECONDS,
        )
    return FailedPrecondition(f"{where}: refused, {words}")
