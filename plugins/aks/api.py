"""The one adapter over azure-mgmt-containerservice: ARM calls with deadlines and bounded
retries, answers as ARM's JSON (wire names), and ARM errors turned into the contract's
PluginErrors (the table in docs/plugins/aks.md)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from azure.core import MatchConditions
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.polling import LROPoller
from azure.identity import DefaultAzureCredential, WorkloadIdentityCredential
from azure.mgmt.containerservice import ContainerServiceClient
from azure.mgmt.containerservice.models import AgentPool, ManagedCluster

from plugins.aks.config import ARM_ENDPOINT, ApiConfig, ConfigError
from plugins.aks.ids import ClusterRef
from plugins.aks.rules import BUSY_RETRY_SECONDS
from plugins.sdk import FailedPrecondition, NotFound, PluginError, Reason, Unavailable, redact

__all__ = ["AksApi", "ArmBusy", "Json", "build_credential", "operation_failed", "plugin_error"]

_LOG = logging.getLogger("plugins.aks.api")
_T = TypeVar("_T")
Json = dict[str, Any]

# ARM error codes with a contract reason. K8sVersionNotSupported and
# NodePoolMcVersionIncompatible are AKS's documented codes (Microsoft Learn, "Troubleshoot the
# K8sVersionNotSupported error code" / "... NodePoolMcVersionIncompatible error code"); the
# plugin checks the upgrade profile first, so these answer only when AKS changed in between.
_REASON_OF_CODE = {
    "K8sVersionNotSupported": Reason.VERSION_NOT_OFFERED,
    "NodePoolMcVersionIncompatible": Reason.NODE_POOL_AHEAD_OF_CONTROL_PLANE,
    "NotAllowedDowngrade": Reason.DOWNGRADE_NOT_SUPPORTED,
    "UpgradeNotAllowed": Reason.MINOR_VERSION_SKIP,
}


class ArmBusy(FailedPrecondition):
    """ARM answered 409 (OperationNotAllowed: another operation runs on the cluster)."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: AKS runs another operation on the cluster (HTTP 409 OperationNotAllowed); "
            "ask again when it has ended",
            reason=Reason.CLUSTER_BUSY,
            retry_after=BUSY_RETRY_SECONDS,
        )


def _retry_after(exc: HttpResponseError) -> float:
    headers = getattr(exc.response, "headers", None) or {}
    value = str(headers.get("Retry-After", ""))
    try:
        return max(0.0, float(value))
    except ValueError:
        return 0.0


def operation_failed(exc: BaseException) -> bool:
    """A poller's error that is ARM's verdict on the operation (its status resource answered,
    2xx, with status Failed or Canceled), not a failure to ask."""
    status = getattr(exc, "status_code", None)
    return isinstance(exc, HttpResponseError) and status is not None and 200 <= status < 300


def error_code(exc: HttpResponseError) -> str:
    """ARM's error.code (a fixed vocabulary, safe to show), or "" when there is none."""
    error = exc.error
    code = getattr(error, "code", None) if error is not None else None
    return str(code) if code else ""


def plugin_error(exc: BaseException, what: str, pool: str = "") -> PluginError:
    """The contract's error for an ARM failure while doing `what` (a fixed phrase).

    ARM's message is logged redacted, never answered: the words are fixed here, with ARM's
    status and error code.
    """
    if isinstance(exc, ClientAuthenticationError) and exc.status_code is None:
        # azure-identity could not get a token (no answer from ARM at all).
        _LOG.warning("no Azure token: %s", redact(str(exc)))
        return Unavailable(
            f"{what}: the plugin has no Azure token (workload identity not configured?); "
            "see the plugin's log"
        )
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        _LOG.warning("ARM unreachable while %s: %s", what, type(exc).__name__)
        return Unavailable(f"{what}: Azure Resource Manager is unreachable", retry_after=0)
    if not isinstance(exc, HttpResponseError):
        raise exc
    status = exc.status_code or 0
    code = error_code(exc)
    label = f"HTTP {status}{' ' + code if code else ''}"
    _LOG.warning(
        "ARM refused a request",
        extra={
            "fields": {
                "what": what,
                "status": status,
                "code": code,
                "message": redact(exc.message or ""),
            }
        },
    )
    if status == 404:
        if pool:
            return NotFound(
                f"{what}: node pool {pool} not found ({label})", reason=Reason.NODE_POOL_NOT_FOUND
            )
        return NotFound(f"{what}: cluster not found ({label})", reason=Reason.CLUSTER_NOT_FOUND)
    if status == 409:
        return ArmBusy(what)
    if status == 412:
        return FailedPrecondition(
            f"{what}: the resource changed while the plugin acted on it ({label}); ask again",
            retry_after=1.0,
        )
    if status == 429 or status >= 500:
        return Unavailable(
            f"{what}: Azure Resource Manager is unavailable ({label})",
            retry_after=_retry_after(exc),
        )
    if status in (401, 403):
        return FailedPrecondition(
            f"{what}: not authorized ({label}); give the plugin's identity the role in "
            "manifests/aks/role-definition.json"
        )
    return FailedPrecondition(
        f"{what}: AKS refused the request ({label})",
        reason=_REASON_OF_CODE.get(code, Reason.FAILED_PRECONDITION),
    )


def build_credential(config: ApiConfig) -> TokenCredential:
    """The plugin's Azure credential (never read from the configuration file)."""
    if config.credentials == "default":
        return DefaultAzureCredential(exclude_interactive_browser_credential=True)
    try:
        return WorkloadIdentityCredential(
            disable_instance_discovery=config.disable_instance_discovery
        )
    except ValueError:
        raise ConfigError(
            "api.credentials: workloadIdentity needs AZURE_TENANT_ID, AZURE_CLIENT_ID and "
            "AZURE_FEDERATED_TOKEN_FILE in the environment (the AKS workload identity webhook "
            "sets them for a pod whose ServiceAccount is annotated azure.workload.identity/"
            "client-id); or set api.credentials: default"
        ) from None


class AksApi:
    """ContainerServiceClient per subscription; every call maps ARM errors to PluginErrors."""

    def __init__(self, config: ApiConfig, credential: TokenCredential, poll_seconds: float) -> None:
        self._config = config
        self._credential = credential
        self._poll_seconds = poll_seconds
        self._clients: dict[str, ContainerServiceClient] = {}
        self._lock = threading.Lock()

    def client(self, subscription: str) -> ContainerServiceClient:
        with self._lock:
            client = self._clients.get(subscription)
            if client is None:
                options: dict[str, Any] = {
                    "base_url": self._config.endpoint,
                    "polling_interval": self._poll_seconds,
                    "retry_total": self._config.retries,
                    "connection_timeout": self._config.timeout_seconds,
                    "read_timeout": self._config.timeout_seconds,
                }
                if self._config.endpoint != ARM_ENDPOINT:
                    options["credential_scopes"] = [f"{self._config.endpoint}/.default"]
                if self._config.ca_file:
                    options["connection_verify"] = self._config.ca_file
                client = ContainerServiceClient(self._credential, subscription, **options)
                self._clients[subscription] = client
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    @staticmethod
    def _call(what: str, call: Callable[[], _T], pool: str = "") -> _T:
        try:
            return call()
        except (
            HttpResponseError,
            ServiceRequestError,
            ServiceResponseError,
            ClientAuthenticationError,
        ) as exc:
            raise plugin_error(exc, what, pool) from None

    # ------------------------------------------------------------------------ reads

    def list_clusters(self, subscription: str, group: str) -> list[Json]:
        """Managed clusters of a subscription (ManagedClusters_List) or of one resource group
        (ManagedClusters_ListByResourceGroup), every page."""
        ops = self.client(subscription).managed_clusters
        if group:
            return self._call(
                "listing managed clusters",
                lambda: [mc.as_dict() for mc in ops.list_by_resource_group(group)],
            )
        return self._call("listing managed clusters", lambda: [mc.as_dict() for mc in ops.list()])

    def get_cluster(self, ref: ClusterRef) -> ManagedCluster:
        ops = self.client(ref.subscription).managed_clusters
        return self._call("reading the cluster", lambda: ops.get(ref.group, ref.name))

    def upgrade_profile(self, ref: ClusterRef) -> Json:
        ops = self.client(ref.subscription).managed_clusters
        return self._call(
            "reading the upgrade profile",
            lambda: ops.get_upgrade_profile(ref.group, ref.name).as_dict(),
        )

    def maintenance_configurations(self, ref: ClusterRef) -> list[Json]:
        ops = self.client(ref.subscription).maintenance_configurations
        return self._call(
            "reading maintenance configurations",
            lambda: [m.as_dict() for m in ops.list_by_managed_cluster(ref.group, ref.name)],
        )

    def get_pool(self, ref: ClusterRef, pool: str) -> AgentPool:
        ops = self.client(ref.subscription).agent_pools
        return self._call("reading the node pool", lambda: ops.get(ref.group, ref.name, pool), pool)

    def node_images(self, ref: ClusterRef, pool: str) -> tuple[str, str]:
        """(the pool's nodeImageVersion, AKS's latestNodeImageVersion for it), from the pool
        and its upgrade profile (AgentPools_GetUpgradeProfile)."""
        ops = self.client(ref.subscription).agent_pools

        def read() -> tuple[str, str]:
            current = ops.get(ref.group, ref.name, pool).as_dict()
            profile = ops.get_upgrade_profile(ref.group, ref.name, pool).as_dict()
            return (
                str((current.get("properties") or {}).get("nodeImageVersion") or ""),
                str((profile.get("properties") or {}).get("latestNodeImageVersion") or ""),
            )

        return self._call("reading the node image versions", read, pool)

    # -------------------------------------------------------------------- mutations

    def begin_control_plane(
        self, ref: ClusterRef, cluster: ManagedCluster, version: str
    ) -> LROPoller[ManagedCluster]:
        """PUT the cluster as read with kubernetesVersion changed and its agent pools as they
        are: a control-plane-only upgrade (the pools' orchestratorVersion unchanged), guarded
        by If-Match on the etag read (a cluster changed in between answers 412)."""
        ops = self.client(ref.subscription).managed_clusters
        properties = cluster.properties
        if properties is None:
            raise FailedPrecondition("upgrading the control plane: ARM sent no cluster properties")
        properties.kubernetes_version = version
        etag = cluster.e_tag
        return self._call(
            "upgrading the control plane",
            lambda: ops.begin_create_or_update(
                ref.group,
                ref.name,
                cluster,
                etag=etag,
                match_condition=MatchConditions.IfNotModified if etag else None,
            ),
        )

    def begin_node_pool(
        self, ref: ClusterRef, pool: AgentPool, name: str, version: str
    ) -> LROPoller[AgentPool]:
        """PUT the agent pool as read with orchestratorVersion changed."""
        ops = self.client(ref.subscription).agent_pools
        if pool.properties is None:
            raise FailedPrecondition("upgrading the node pool: ARM sent no pool properties")
        pool.properties.orchestrator_version = version
        return self._call(
            "upgrading the node pool",
            lambda: ops.begin_create_or_update(ref.group, ref.name, name, pool),
            name,
        )

    def begin_node_image(self, ref: ClusterRef, name: str) -> LROPoller[None]:
        """POST agentPools/{name}/upgradeNodeImageVersion: the latest node image, same version."""
        ops = self.client(ref.subscription).agent_pools
        return self._call(
            "upgrading the node image",
            lambda: ops.begin_upgrade_node_image_version(ref.group, ref.name, name),
            name,
        )

    def resume(self, ref: ClusterRef, kind: str, pool: str, token: str) -> LROPoller[Any]:
        """The poller of an operation started earlier, from its continuation token (the SDK's
        own way to follow an ARM operation from another process)."""
        client = self.client(ref.subscription)
        if kind == "cluster":
            return client.managed_clusters.begin_create_or_update(
                ref.group,
                ref.name,
                cast(ManagedCluster, None),
                continuation_token=token,
            )
        if kind == "pool":
            return client.agent_pools.begin_create_or_update(
                ref.group,
                ref.name,
                pool,
                cast(AgentPool, None),
                continuation_token=token,
            )
        return client.agent_pools.begin_upgrade_node_image_version(
            ref.group, ref.name, pool, continuation_token=token
        )
