"""Caller side of the original operator's `plugin.Cluster` service: one long-lived channel,
deadlines, retries of reads only, and upstream errors turned into the contract's errors."""

from __future__ import annotations

import json
import threading
import time
import weakref
from typing import Any, TypeVar

import grpc
from google.protobuf import empty_pb2
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from plugins.legacy._gen import plugin_pb2, plugin_pb2_grpc
from plugins.sdk import ClientTLS, FailedPrecondition, NotFound, PluginError, Unavailable

__all__ = ["SERVICE", "Upstream", "UpstreamError", "UpstreamMetrics"]

SERVICE: str = plugin_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name
"""The original service's full name on the wire ("plugin.Cluster")."""

_READS = ("HealthCheck", "GetVersion", "GetClusterStatus", "GetOperationStatus")

# Reads are safe to repeat, so they retry on UNAVAILABLE within their deadline. Mutations
# never retry here: the original has no request ids, so a repeat would start a second
# operation (the bridge decides what to do after an error, see bridge.py).
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": SERVICE, "method": m} for m in _READS],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)
_RECONNECT_INITIAL_MS = 250
_RECONNECT_MAX_MS = 5_000
_MAX_DETAIL = 300  # characters of the upstream's error text kept in our messages

# Codes after which the upstream may or may not have acted on a mutation.
_AMBIGUOUS = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})
# Codes that mean the upstream refused the request as asked: repeating it does not help.
_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

R = TypeVar("R")


class UpstreamMetrics:
    """Calls to the upstream plugin by RPC and status code, and their latency (the original
    operator counted its plugin calls too)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "fleet_legacy_upstream_calls_total",
            "Calls from the legacy bridge to the original plugin server, by RPC and code.",
            ("rpc", "code"),
            registry=registry,
        )
        self.duration = Histogram(
            "fleet_legacy_upstream_call_duration_seconds",
            "Time of a call from the legacy bridge to the original plugin server.",
            ("rpc",),
            registry=registry,
        )

    @classmethod
    def of(cls, registry: CollectorRegistry) -> UpstreamMetrics:
        """The registry's metrics, created once (safe to call many times)."""
        with _METRICS_LOCK:
            metrics = _METRICS.get(registry)
            if metrics is None:
                metrics = cls(registry)
                _METRICS[registry] = metrics
            return metrics


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, UpstreamMetrics] = (
    weakref.WeakKeyDictionary()
)
_METRICS_LOCK = threading.Lock()


class UpstreamError(Exception):
    """An RPC to the upstream plugin failed; code and details as the upstream answered."""

    def __init__(self, endpoint: str, rpc: str, code: grpc.StatusCode, details: str) -> None:
        self.endpoint = endpoint
        self.rpc = rpc
        self.code = code
        self.details = details[:_MAX_DETAIL]
        super().__init__(f"upstream plugin {endpoint} {rpc}: {code.name}: {self.details}")

    @property
    def ambiguous(self) -> bool:
        """True when a mutation may have been acted on although the call failed."""
        return self.code in _AMBIGUOUS

    def to_plugin_error(self, subject: str) -> PluginError:
        """The contract's error for this failure; subject says what was asked ("cluster c1")."""
        what = f"the upstream plugin at {self.endpoint} answered {self.rpc} for {subject} with"
        said = f"{self.code.name}: {self.details or '(no message)'}"
        if self.code is grpc.StatusCode.NOT_FOUND:
            return NotFound(f"{what} {said}; check the id against the upstream plugin")
        if self.code in _REFUSED:
            hint = (
                "check the bridge's --upstream TLS flags and the upstream's credentials"
                if self.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
                else "the request cannot succeed as asked; change it or the cluster"
            )
            return FailedPrecondition(f"{what} {said}; {hint}")
        if self.code is grpc.StatusCode.UNAVAILABLE:
            return Unavailable(
                f"the upstream plugin at {self.endpoint} is unreachable ({self.rpc} for "
                f"{subject}: {said}); retry with backoff"
            )
        return Unavailable(f"{what} {said}; retry with backoff")


class Upstream:
    """The upstream plugin server over one channel, reused by every call (the original
    operator dialled a new connection per call). Every method raises UpstreamError."""

    def __init__(
        self,
        endpoint: str,
        tls: ClientTLS | None = None,
        *,
        timeout: float = 8.0,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        if not endpoint:
            raise ValueError("--upstream: must not be empty; pass the plugin's HOST:PORT")
        if timeout <= 0:
            raise ValueError("--upstream-timeout: must be positive seconds")
        self.endpoint = endpoint
        self.timeout = timeout
        self._metrics = UpstreamMetrics.of(registry)
        options: list[tuple[str, Any]] = [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", _SERVICE_CONFIG),
            ("grpc.initial_reconnect_backoff_ms", _RECONNECT_INITIAL_MS),
            ("grpc.min_reconnect_backoff_ms", _RECONNECT_INITIAL_MS),
            ("grpc.max_reconnect_backoff_ms", _RECONNECT_MAX_MS),
        ]
        if tls is None:
            self._channel = grpc.insecure_channel(endpoint, options=options)
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self._channel = grpc.secure_channel(endpoint, tls.credentials(), options=options)
        self._stub = plugin_pb2_grpc.ClusterStub(self._channel)
        self._closed = False

    def _call(self, rpc: str, method: grpc.UnaryUnaryMultiCallable[Any, R], request: Any) -> R:
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            raise UpstreamError(self.endpoint, rpc, code, exc.details() or "") from None
        except ValueError:
            # grpc refuses a call on a closed channel before sending anything (the bridge is
            # stopping under a handler still running): not reached, so not ambiguous.
            if not self._closed:
                raise
            code = grpc.StatusCode.UNAVAILABLE
            raise UpstreamError(self.endpoint, rpc, code, "the bridge is stopping") from None
        finally:
            self._metrics.calls.labels(rpc, code.name).inc()
            self._metrics.duration.labels(rpc).observe(time.perf_counter() - start)

    def health_check(self) -> None:
        """Answers when the upstream plugin is ready."""
        self._call("HealthCheck", self._stub.HealthCheck, empty_pb2.Empty())

    def get_version(self, cluster_id: str) -> plugin_pb2.ClusterVersion:
        """The cluster's master and node pool versions."""
        request = plugin_pb2.GetVersionRequest(clusterID=cluster_id)
        return self._call("GetVersion", self._stub.GetVersion, request)

    def get_cluster_status(self, cluster_id: str) -> plugin_pb2.ClusterStatus:
        """Whether the cluster is in service and available."""
        request = plugin_pb2.GetClusterStatusRequest(clusterID=cluster_id)
        return self._call("GetClusterStatus", self._stub.GetClusterStatus, request)

    def get_operation_status(
        self, cluster_id: str, operation_id: str, op_type: str
    ) -> plugin_pb2.OperationStatusType.ValueType:
        """UNKNOWN, RUNNING, DONE or FAILED for an operation a mutation returned."""
        request = plugin_pb2.GetOperationStatusRequest(
            clusterID=cluster_id, operationID=operation_id, type=op_type
        )
        return self._call("GetOperationStatus", self._stub.GetOperationStatus, request).status

    def service_in(self, cluster_id: str) -> plugin_pb2.Operation:
        """Starts putting the cluster back in service."""
        request = plugin_pb2.ServiceInRequest(clusterID=cluster_id)
        return self._call("ServiceIn", self._stub.ServiceIn, request)

    def service_out(self, cluster_id: str) -> plugin_pb2.Operation:
        """Starts taking the cluster out of service."""
        request = plugin_pb2.ServiceOutRequest(clusterID=cluster_id)
        return self._call("ServiceOut", self._stub.ServiceOut, request)

    def upgrade_master(self, cluster_id: str, version: str) -> plugin_pb2.Operation:
        """Starts the master (control plane) upgrade."""
        request = plugin_pb2.MasterVersion(clusterID=cluster_id, version=version)
        return self._call("UpgradeMaster", self._stub.UpgradeMaster, request)

    def upgrade_node_pool(
        self, cluster_id: str, node_pool: str, version: str
    ) -> plugin_pb2.Operation:
        """Starts the upgrade of one node pool."""
        request = plugin_pb2.NodePoolVersion(
            clusterID=cluster_id, nodePoolID=node_pool, version=version
        )
        return self._call("UpgradeNodePool", self._stub.UpgradeNodePool, request)

    def close(self) -> None:
        """Closes the channel; a call made after it fails UNAVAILABLE, never reaching upstream."""
        self._closed = True
        self._channel.close()
