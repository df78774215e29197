"""Caller side of the plugin contract: one long-lived channel with TLS, deadlines and retries."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar

import grpc
import grpc.experimental
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
)
from plugins.sdk.errors import ERROR_DOMAIN, status_code
from plugins.sdk.interceptors import CALLER_METADATA_KEY, OPERATION_ID_METADATA_KEY

__all__ = [
    "DEFAULT_TIMEOUTS",
    "MUTATING_RPCS",
    "RPC_CAPABILITIES",
    "ClientTLS",
    "ClusterListing",
    "ErrorDetails",
    "GateWatch",
    "OperationChangeWatch",
    "OperationWatch",
    "PendingCall",
    "PluginCallError",
    "PluginClient",
    "error_details",
    "is_retryable",
    "status_details",
    "supports",
]

DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "GetPluginInfo": 5.0,
    "GetPluginCapabilities": 5.0,
    "Probe": 10.0,
    "ListClusters": 30.0,
    "GetCluster": 5.0,
    "ServiceOut": 10.0,
    "ServiceIn": 10.0,
    "UpgradeControlPlane": 10.0,
    "UpgradeNodePool": 10.0,
    "StartOperations": 30.0,
    "GetOperation": 5.0,
    "PreflightUpgrade": 10.0,
    "PreflightUpgrades": 30.0,
    "CheckWorkloads": 30.0,
    "QueryMetric": 30.0,
    "ListGates": 30.0,
    "ResolveGate": 10.0,
}
"""Per-RPC deadlines in seconds, from the contract's comments (streams have none)."""

_CAP = identity_pb2.PluginCapability
_OPERATION_CAPS = frozenset(
    {
        _CAP.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
        _CAP.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
        _CAP.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
    }
)
RPC_CAPABILITIES: Mapping[str, frozenset[int]] = {
    "ListClusters": frozenset({_CAP.PLUGIN_CAPABILITY_CLUSTER_INVENTORY}),
    "GetCluster": frozenset({_CAP.PLUGIN_CAPABILITY_CLUSTER_INVENTORY}),
    "ServiceOut": frozenset({_CAP.PLUGIN_CAPABILITY_CLUSTER_SERVICE}),
    "ServiceIn": frozenset({_CAP.PLUGIN_CAPABILITY_CLUSTER_SERVICE}),
    "UpgradeControlPlane": frozenset({_CAP.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE}),
    "UpgradeNodePool": frozenset({_CAP.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL}),
    "StartOperations": _OPERATION_CAPS,
    "GetOperation": _OPERATION_CAPS,
    "WatchOperations": _OPERATION_CAPS,
    "PreflightUpgrade": frozenset({_CAP.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE}),
    "PreflightUpgrades": frozenset({_CAP.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE}),
    "CheckWorkloads": frozenset({_CAP.PLUGIN_CAPABILITY_CHECK_WORKLOADS}),
    "QueryMetric": frozenset({_CAP.PLUGIN_CAPABILITY_QUERY_METRIC}),
    "ListGates": frozenset({_CAP.PLUGIN_CAPABILITY_GATES}),
    "WatchGates": frozenset({_CAP.PLUGIN_CAPABILITY_GATES}),
    "ResolveGate": frozenset({_CAP.PLUGIN_CAPABILITY_GATES}),
}
"""For each RPC outside IdentityService: the capabilities of which any one enables it."""

MUTATING_RPCS = frozenset(
    {
        "ServiceOut",
        "ServiceIn",
        "UpgradeControlPlane",
        "UpgradeNodePool",
        "StartOperations",
        "ResolveGate",
    }
)
"""RPCs that change the provider; for them ABORTED means a conflict, not a transient race."""

_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

_SERVICES = (
    "fleetupgrade.plugin.v1.IdentityService",
    "fleetupgrade.plugin.v1.ClusterService",
    "fleetupgrade.plugin.v1.HealthService",
    "fleetupgrade.plugin.v1.GateService",
)

# Every RPC of the contract is safe to repeat (mutating ones by request_id), so each retries
# on UNAVAILABLE; the deadline of the call covers all attempts.
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": name} for name in _SERVICES],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_RECONNECT_INITIAL_MS = 250
_RECONNECT_MAX_MS = 5_000
_MAX_PAGES = 1_000_000


@dataclass(frozen=True)
class ClusterListing:
    """One ListClusters listing, all pages (PluginClient.list_since)."""

    clusters: list[cluster_pb2.Cluster]
    #: The first page's revision: pass it as changed_since to list what changed since ("":
    #: the plugin keeps no revisions).
    revision: str
    #: True: only the clusters changed since the request's changed_since, and `removed`.
    changes_only: bool
    removed: list[str]


def is_retryable(rpc: str, code: grpc.StatusCode) -> bool:
    """The contract's error table: may the caller repeat this RPC after this code?"""
    if code in _RETRYABLE:
        return True
    return code is grpc.StatusCode.ABORTED and rpc not in MUTATING_RPCS


def supports(capabilities: frozenset[int], rpc: str) -> bool:
    """Whether a plugin declaring capabilities serves rpc (IdentityService RPCs: always)."""
    needed = RPC_CAPABILITIES.get(rpc)
    return needed is None or not needed.isdisjoint(capabilities)


class PluginCallError(Exception):
    """A plugin RPC failed; code, reason, retryable and retry_after say what to do next.

    reason, domain and metadata come from the google.rpc.ErrorInfo the plugin sent ("" and {}
    when it sent none). retryable is True when the code table says a repeat can help
    (is_retryable) or the plugin sent a google.rpc.RetryInfo; retry_after is that RetryInfo's
    delay in seconds (None when the plugin sent none; 0.0 means "use your own backoff").
    """

    def __init__(
        self,
        rpc: str,
        code: grpc.StatusCode,
        message: str,
        *,
        plugin: str = "",
        operation_id: str = "",
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.rpc = rpc
        self.code = code
        self.message = message
        self.plugin = plugin
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        # The in-flight operation of an ABORTED answer (trailing metadata, or ErrorInfo).
        self.operation_id = operation_id or self.metadata.get("operation_id", "")
        self.retry_after = retry_after
        self.retryable = is_retryable(rpc, code) or retry_after is not None
        where = f"{plugin} {rpc}" if plugin else rpc
        super().__init__(f"{where}: {code.name}: {message}")

    @property
    def contract_reason(self) -> str:
        """reason when it is one of the contract's (domain fleetupgrade.io), else ""."""
        return self.reason if self.domain == ERROR_DOMAIN else ""


@dataclass(frozen=True)
class ErrorDetails:
    """What a failed call's google.rpc.Status details said (empty when it had none)."""

    reason: str = ""
    domain: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    retry_after: float | None = None


def error_details(call: Any) -> ErrorDetails:
    """The ErrorInfo and RetryInfo of a failed grpc call (grpc.RpcError that is a grpc.Call).

    Unreadable or inconsistent details count as none: the code alone then decides.
    """
    try:
        status = rpc_status.from_call(call)
    except (ValueError, AttributeError, TypeError):
        return ErrorDetails()
    if status is None:
        return ErrorDetails()
    return status_details(status.details)


def status_details(details: Sequence[Any]) -> ErrorDetails:
    """The ErrorInfo and RetryInfo among a status's details (google.protobuf.Any each)."""
    reason, domain, metadata, retry_after = "", "", {}, None
    for detail in details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            if detail.Unpack(retry):
                retry_after = max(0.0, retry.retry_delay.ToNanoseconds() / 1e9)
    return ErrorDetails(reason, domain, metadata, retry_after)


@dataclass(frozen=True)
class ClientTLS:
    """TLS towards a plugin: CA (None = system roots), client cert + key for mTLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    ca_pem: bytes | None = field(default=None, repr=False)
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_pem(
        cls,
        ca: bytes | None,
        cert: bytes | None,
        key: bytes | None,
        server_name: str | None = None,
    ) -> ClientTLS:
        """TLS from PEM bytes (e.g. read from a Kubernetes Secret), no files needed."""
        return cls(server_name=server_name, ca_pem=ca, cert_pem=cert, key_pem=key)

    def credentials(self) -> grpc.ChannelCredentials:
        """Reads the files (or takes the PEM bytes) and builds the channel credentials."""
        ca = self.ca_pem if self.ca_pem is not None else _read("ca_file", self.ca_file)
        cert = self.cert_pem if self.cert_pem is not None else _read("cert_file", self.cert_file)
        key = self.key_pem if self.key_pem is not None else _read("key_file", self.key_file)
        if (cert is None) != (key is None):
            missing = "key_file" if key is None else "cert_file"
            raise ValueError(f"tls.{missing}: a client certificate needs both cert and key")
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


def _read(name: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"tls.{name}: cannot read {path!r} ({exc.strerror})") from exc


def _metadata_value(metadata: Any, key: str) -> str:
    for item in metadata or ():
        k, v = item[0], item[1]
        if k == key:
            return v if isinstance(v, str) else bytes(v).decode("utf-8", "replace")
    return ""


T = TypeVar("T")
R = TypeVar("R")
#: A unary method of a stub and the request to send it.
_Unary: TypeAlias = "tuple[grpc.UnaryUnaryMultiCallable[Any, Any], Any]"


class _Watch(Generic[R, T]):
    """A server stream: iterate for items, cancel() to end it; errors are PluginCallError."""

    def __init__(
        self,
        client: PluginClient,
        rpc: str,
        call: grpc.CallIterator[R],
        unwrap: Callable[[R], T],
    ) -> None:
        self._client = client
        self._rpc = rpc
        self._call = call
        self._unwrap = unwrap
        self._cancelled = False
        self._start = time.perf_counter()

    def __iter__(self) -> Iterator[T]:
        try:
            for item in self._call:
                yield self._unwrap(item)
        except grpc.RpcError as exc:
            code = exc.code()
            self._client._record(self._rpc, code, time.perf_counter() - self._start)
            if code is grpc.StatusCode.CANCELLED and self._cancelled:
                return
            raise self._client._error(self._rpc, exc) from None
        self._client._record(self._rpc, grpc.StatusCode.OK, time.perf_counter() - self._start)

    def cancel(self) -> None:
        """Ends the stream; an iteration in progress stops without an error."""
        self._cancelled = True
        self._call.cancel()  # type: ignore[no-untyped-call]

    def __enter__(self) -> _Watch[R, T]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cancel()


class OperationWatch(_Watch[cluster_pb2.WatchOperationsResponse, cluster_pb2.Operation]):
    """The WatchOperations stream: yields each updated Operation."""


class OperationChangeWatch(
    _Watch[cluster_pb2.WatchOperationsResponse, cluster_pb2.WatchOperationsResponse]
):
    """The WatchOperations stream: yields each response (operation, revision, resync)."""


class GateWatch(_Watch[gate_pb2.WatchGatesResponse, gate_pb2.WatchGatesResponse]):
    """The WatchGates stream: yields each WatchGatesResponse (event type + gate)."""


class PendingCall(Generic[T]):
    """A unary call started by one of PluginClient's `start_*` methods: `result()` waits for
    its answer and raises PluginCallError as the blocking call would.

    Started calls cost the caller less CPU than the same calls blocking on as many threads: a
    blocking call polls a completion queue of its own and takes the channel's lock around
    each event, so threads that wait on calls of one channel contend on that lock (the
    measurement: benchmarks.bench_plugin_calls). A started call is completed by the channel's
    own polling thread.
    """

    def __init__(
        self,
        client: PluginClient,
        rpc: str,
        future: Any,
        unwrap: Callable[[Any], T],
        start: float,
    ) -> None:
        self._client = client
        self._rpc = rpc
        self._future = future  # a grpc.Future that is also a grpc.Call
        self._unwrap = unwrap
        self._start = start
        self._end: float | None = None
        future.add_done_callback(self._ended)

    def _ended(self, _future: object) -> None:
        """When the answer came (on the channel's thread): the latency on_call records."""
        self._end = time.perf_counter()

    def _seconds(self) -> float:
        return (self._end or time.perf_counter()) - self._start

    def result(self) -> T:
        """Wait for the answer (the call's deadline bounds the wait); on_call records the
        call's own latency (until the answer came, not until it was asked for)."""
        response = self._client._answered(self._rpc, self._future.result, self._seconds)
        return self._unwrap(response)


def _identity(item: T) -> T:
    return item


#: A StartOperations item's field → the RPC it stands for (its deadline, metrics, errors).
ITEM_RPCS: Mapping[str, str] = {
    "service_out": "ServiceOut",
    "service_in": "ServiceIn",
    "upgrade_control_plane": "UpgradeControlPlane",
    "upgrade_node_pool": "UpgradeNodePool",
}


class PendingBatch(Generic[T]):
    """A batch call (StartOperations, PreflightUpgrades) started by the client
    (`PluginClient.start_operations`, `start_preflights`): `results()` waits for its answer
    and gives, for each item in order, its answer (an Operation, a PreflightUpgradeResponse)
    or the PluginCallError its own RPC would have raised. A failure of the whole call is every
    item's error.

    on_call records each item under its own RPC's name (ServiceOut, PreflightUpgrade, ...),
    with the call's latency, so that counts per RPC are the same whether batched or not."""

    def __init__(
        self,
        client: PluginClient,
        batch: str,
        rpcs: Sequence[str],
        future: Any,
        start: float,
        answer: str,
    ) -> None:
        self._client = client
        self._batch = batch
        self._rpcs = rpcs
        self._future = future
        self._start = start
        #: The field of an item's result that holds its answer (the other is its error).
        self._answer = answer
        self._end: float | None = None
        future.add_done_callback(self._ended)

    def _ended(self, _future: object) -> None:
        self._end = time.perf_counter()

    def results(self) -> list[T | PluginCallError]:
        """Each item's answer, in the order asked."""
        client, rpcs = self._client, self._rpcs
        try:
            response = self._future.result()
        except grpc.RpcError as exc:
            seconds = (self._end or time.perf_counter()) - self._start
            out: list[T | PluginCallError] = []
            for rpc in rpcs:
                client._record(rpc, exc.code(), seconds)
                out.append(client._error(rpc, exc))
            return out
        seconds = (self._end or time.perf_counter()) - self._start
        results = response.results
        if len(results) != len(rpcs):
            # A plugin that broke the contract: no item's fate is known.
            message = f"{self._batch} answered {len(results)} results for {len(rpcs)} items"
            for rpc in rpcs:
                client._record(rpc, grpc.StatusCode.INTERNAL, seconds)
            return [
                PluginCallError(rpc, grpc.StatusCode.INTERNAL, message, plugin=client.plugin_name)
                for rpc in rpcs
            ]
        out = []
        for rpc, result in zip(rpcs, results, strict=True):
            if result.WhichOneof("result") == self._answer:
                client._record(rpc, grpc.StatusCode.OK, seconds)
                out.append(getattr(result, self._answer))
                continue
            err = client.item_error(rpc, result.error, getattr(result, "operation_id", ""))
            client._record(rpc, err.code, seconds)
            out.append(err)
        return out


class PluginClient:
    """One plugin endpoint over one long-lived channel; every method raises PluginCallError."""

    def __init__(
        self,
        endpoint: str,
        *,
        tls: ClientTLS | None = None,
        caller: str = "",
        plugin_name: str = "",
        timeouts: Mapping[str, float] | None = None,
        on_call: Callable[[str, grpc.StatusCode, float], None] | None = None,
    ) -> None:
        unknown = sorted(set(timeouts or {}) - set(DEFAULT_TIMEOUTS))
        if unknown:
            raise ValueError(
                f"timeouts: unknown RPC name(s) {', '.join(unknown)}; "
                f"use one of {', '.join(sorted(DEFAULT_TIMEOUTS))}"
            )
        self.endpoint = endpoint
        self.plugin_name = plugin_name
        self.on_call = on_call
        self._timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self._metadata: tuple[tuple[str, str], ...] = (
            ((CALLER_METADATA_KEY, caller),) if caller else ()
        )
        options: list[tuple[str, Any]] = [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", _SERVICE_CONFIG),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            # A plugin that was down (a sidecar restarting) is found again within seconds:
            # gRPC's default reconnect backoff grows to 120 s.
            ("grpc.initial_reconnect_backoff_ms", _RECONNECT_INITIAL_MS),
            ("grpc.min_reconnect_backoff_ms", _RECONNECT_INITIAL_MS),
            ("grpc.max_reconnect_backoff_ms", _RECONNECT_MAX_MS),
            # Server streams (WatchOperations, WatchGates) are read on the thread that
            # iterates them: each message is not handed over from the channel's polling
            # thread (a wake-up and a lock round per message). Iteration and cancel() are
            # all _Watch uses of the call.
            (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
        ]
        if tls is None:
            self._channel = grpc.insecure_channel(endpoint, options=options)
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self._channel = grpc.secure_channel(endpoint, tls.credentials(), options=options)
        self._identity = identity_pb2_grpc.IdentityServiceStub(self._channel)
        self._cluster = cluster_pb2_grpc.ClusterServiceStub(self._channel)
        # The batch RPCs are optional: whether the plugin offers each (StartOperations,
        # PreflightUpgrades; absent: not known yet: its first answer says, and UNIMPLEMENTED
        # stops asking).
        self._offers: dict[str, bool] = {}
        self._health = health_pb2_grpc.HealthServiceStub(self._channel)
        self._gate = gate_pb2_grpc.GateServiceStub(self._channel)
        self._capabilities: frozenset[int] | None = None
        self._lock = threading.Lock()

    @property
    def channel(self) -> grpc.Channel:
        """The client's channel, e.g. for grpc.health.v1 checks or raw stubs."""
        return self._channel

    # -- plumbing ------------------------------------------------------------------------

    def _record(self, rpc: str, code: grpc.StatusCode, seconds: float) -> None:
        if self.on_call is not None:
            self.on_call(rpc, code, seconds)

    def _error(self, rpc: str, exc: grpc.RpcError) -> PluginCallError:
        trailing: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else ()
        operation_id = _metadata_value(trailing, OPERATION_ID_METADATA_KEY)
        return self._failed(rpc, exc.code(), exc.details() or "", operation_id, error_details(exc))

    def _failed(
        self,
        rpc: str,
        code: grpc.StatusCode,
        message: str,
        operation_id: str,
        details: ErrorDetails,
    ) -> PluginCallError:
        """The one PluginCallError of a failed RPC, or of a StartOperations item."""
        return PluginCallError(
            rpc,
            code,
            message,
            plugin=self.plugin_name,
            operation_id=operation_id,
            reason=details.reason,
            domain=details.domain,
            metadata=details.metadata,
            retry_after=details.retry_after,
        )

    def _start(
        self,
        rpc: str,
        method: grpc.UnaryUnaryMultiCallable[Any, Any],
        request: Any,
        unwrap: Callable[[Any], R],
    ) -> PendingCall[R]:
        """Start a unary call without a thread waiting on it: the same deadline, channel
        retries, metadata and error mapping as `_unary`, its answer unwrapped by `unwrap`."""
        start = time.perf_counter()
        future = method.future(request, timeout=self._timeouts[rpc], metadata=self._metadata)
        return PendingCall(self, rpc, future, unwrap, start)

    def _unary(self, rpc: str, method: grpc.UnaryUnaryMultiCallable[Any, R], request: Any) -> R:
        start = time.perf_counter()
        return self._answered(
            rpc,
            lambda: method(request, timeout=self._timeouts[rpc], metadata=self._metadata),
            lambda: time.perf_counter() - start,
        )

    def _answered(self, rpc: str, wait: Callable[[], T], seconds: Callable[[], float]) -> T:
        """wait's answer to a unary call, recorded (on_call: its code and seconds' latency);
        a gRPC error raised as PluginCallError. One place for blocking and started calls."""
        try:
            response = wait()
        except grpc.RpcError as exc:
            self._record(rpc, exc.code(), seconds())
            raise self._error(rpc, exc) from None
        self._record(rpc, grpc.StatusCode.OK, seconds())
        return response

    # -- IdentityService -----------------------------------------------------------------

    def capabilities(self) -> frozenset[int]:
        """The declared capabilities (PluginCapability values); asked once, then cached."""
        with self._lock:
            if self._capabilities is None:
                response = self._unary(
                    "GetPluginCapabilities",
                    self._identity.GetPluginCapabilities,
                    identity_pb2.GetPluginCapabilitiesRequest(),
                )
                self._capabilities = frozenset(response.capabilities)
            return self._capabilities

    def info(self) -> identity_pb2.GetPluginInfoResponse:
        """The plugin's name, version and manifest."""
        return self._unary(
            "GetPluginInfo", self._identity.GetPluginInfo, identity_pb2.GetPluginInfoRequest()
        )

    def probe(self) -> identity_pb2.ProbeResponse:
        """Whether the plugin can serve now."""
        return self._unary("Probe", self._identity.Probe, identity_pb2.ProbeRequest())

    # -- ClusterService ------------------------------------------------------------------

    def list_page(
        self,
        page_size: int = 0,
        page_token: str = "",
        match_labels: Mapping[str, str] | None = None,
        changed_since: str = "",
    ) -> cluster_pb2.ListClustersResponse:
        """One page of ListClusters, as the plugin answered it."""
        request = cluster_pb2.ListClustersRequest(
            page_size=page_size,
            page_token=page_token,
            match_labels=dict(match_labels or {}),
            changed_since=changed_since,
        )
        return self._unary("ListClusters", self._cluster.ListClusters, request)

    def list_clusters(
        self, match_labels: Mapping[str, str] | None = None, page_size: int = 500
    ) -> list[cluster_pb2.Cluster]:
        """Every cluster matching match_labels, all pages followed."""
        clusters: list[cluster_pb2.Cluster] = []
        for page in self._pages(page_size, match_labels, ""):
            clusters.extend(page.clusters)
        return clusters

    def list_since(self, changed_since: str = "", page_size: int = 500) -> ClusterListing:
        """The inventory, or, with changed_since (an earlier listing's revision), what changed
        since then when the plugin can tell (ListClustersRequest.changed_since), all pages
        followed. Pages that disagree on what they list (the plugin restarted between them)
        are read again whole."""
        for since in (changed_since, ""):
            pages = list(self._pages(page_size, None, since))
            first = pages[0]
            if all(p.changes_only == first.changes_only for p in pages):
                return ClusterListing(
                    [c for p in pages for c in p.clusters],
                    first.revision,
                    first.changes_only,
                    [r for p in pages for r in p.removed_cluster_ids],
                )
        raise PluginCallError(
            "ListClusters",
            grpc.StatusCode.UNAVAILABLE,
            "the plugin's pages disagreed on what they list, twice",
            plugin=self.plugin_name,
        )

    def _pages(
        self, page_size: int, match_labels: Mapping[str, str] | None, changed_since: str
    ) -> Iterator[cluster_pb2.ListClustersResponse]:
        """The pages of one listing, in order."""
        token = ""
        seen_tokens: set[str] = set()
        for _ in range(_MAX_PAGES):
            page = self.list_page(page_size, token, match_labels, changed_since)
            yield page
            token = page.next_page_token
            if not token:
                return
            if token in seen_tokens:
                break
            seen_tokens.add(token)
        raise PluginCallError(
            "ListClusters",
            grpc.StatusCode.INTERNAL,
            "the plugin repeated a next_page_token; its paging is broken",
            plugin=self.plugin_name,
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.Cluster:
        """One cluster by id."""
        request = cluster_pb2.GetClusterRequest(cluster_id=cluster_id)
        return self._unary("GetCluster", self._cluster.GetCluster, request).cluster

    def service_out(self, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """Starts (or finds, by request_id) taking the cluster out of service."""
        return _operation_of(self._unary("ServiceOut", *self._service_out(request_id, cluster_id)))

    def service_in(self, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """Starts (or finds, by request_id) putting the cluster back in service."""
        return _operation_of(self._unary("ServiceIn", *self._service_in(request_id, cluster_id)))

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds, by request_id) the control-plane upgrade to version."""
        call = self._upgrade_control_plane(request_id, cluster_id, version)
        return _operation_of(self._unary("UpgradeControlPlane", *call))

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds, by request_id) the upgrade of one node pool to version."""
        call = self._upgrade_node_pool(request_id, cluster_id, node_pool, version)
        return _operation_of(self._unary("UpgradeNodePool", *call))

    # The same four, started without waiting (PendingCall): a caller with many to make starts
    # them from one thread instead of blocking a thread on each.

    def start_service_out(
        self, request_id: str, cluster_id: str
    ) -> PendingCall[cluster_pb2.Operation]:
        """service_out, started; result() is the Operation."""
        return self.start_operation("service_out", request_id, cluster_id)

    def start_service_in(
        self, request_id: str, cluster_id: str
    ) -> PendingCall[cluster_pb2.Operation]:
        """service_in, started; result() is the Operation."""
        return self.start_operation("service_in", request_id, cluster_id)

    def start_upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str
    ) -> PendingCall[cluster_pb2.Operation]:
        """upgrade_control_plane, started; result() is the Operation."""
        return self.start_operation("upgrade_control_plane", request_id, cluster_id, version)

    def start_upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str
    ) -> PendingCall[cluster_pb2.Operation]:
        """upgrade_node_pool, started; result() is the Operation."""
        return self.start_operation("upgrade_node_pool", request_id, cluster_id, version, node_pool)

    def batches(self) -> bool:
        """Whether StartOperations is worth asking: not once the plugin answered it
        UNIMPLEMENTED (an optional RPC; the single RPCs do the same)."""
        return self._offers.get("StartOperations") is not False

    def start_operations(
        self, requests: Sequence[cluster_pb2.OperationRequest]
    ) -> PendingBatch[cluster_pb2.Operation] | None:
        """StartOperations over these items (`operation_request`), started; None when the
        plugin does not offer it (known from an earlier answer, or from this one: it is asked
        once, blocking on nothing but the answer, and UNIMPLEMENTED leaves every item
        unstarted)."""
        rpcs = [ITEM_RPCS[str(r.WhichOneof("request"))] for r in requests]
        request = cluster_pb2.StartOperationsRequest(requests=requests)
        return self._start_batch("StartOperations", request, rpcs, "operation")

    def start_preflights(
        self, requests: Sequence[cluster_pb2.PreflightUpgradeRequest]
    ) -> PendingBatch[cluster_pb2.PreflightUpgradeResponse] | None:
        """PreflightUpgrades over these items (`preflight_request`), started; None when the
        plugin does not offer it (as for `start_operations`)."""
        request = cluster_pb2.PreflightUpgradesRequest(requests=requests)
        return self._start_batch(
            "PreflightUpgrades", request, ["PreflightUpgrade"] * len(requests), "verdict"
        )

    def _start_batch(
        self, batch: str, request: Any, rpcs: Sequence[str], answer: str
    ) -> PendingBatch[Any] | None:
        offered = self._offers.get(batch)
        if offered is False:
            return None
        start = time.perf_counter()
        future = getattr(self._cluster, batch).future(
            request, timeout=self._timeouts[batch], metadata=self._metadata
        )
        if offered is None:
            # The first ask says whether the plugin offers it at all.
            try:
                future.result()
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    self._offers[batch] = False
                    return None
            else:
                self._offers[batch] = True
        return PendingBatch(self, batch, rpcs, future, start, answer)

    def item_error(
        self, rpc: str, error: cluster_pb2.ItemStatus, operation_id: str = ""
    ) -> PluginCallError:
        """A batch item's error as the PluginCallError of its own RPC (rpc); operation_id: a
        StartOperations item's in-flight operation, with ABORTED."""
        code = status_code(error.code)
        return self._failed(rpc, code, error.message, operation_id, status_details(error.details))

    def operation_request(
        self, kind: str, request_id: str, cluster_id: str, version: str = "", node_pool: str = ""
    ) -> cluster_pb2.OperationRequest:
        """One StartOperations item: kind is an ITEM_RPCS key (e.g. "service_out"); the
        request is the one its own RPC would send."""
        _, request = self._mutation(kind, request_id, cluster_id, version, node_pool)
        return cluster_pb2.OperationRequest(**{kind: request})

    def start_operation(
        self, kind: str, request_id: str, cluster_id: str, version: str = "", node_pool: str = ""
    ) -> PendingCall[cluster_pb2.Operation]:
        """One of the four mutating RPCs, named by its ITEM_RPCS key as for
        `operation_request`, started; result() is the Operation."""
        call = self._mutation(kind, request_id, cluster_id, version, node_pool)
        return self._start(ITEM_RPCS[kind], *call, _operation_of)

    def _mutation(
        self, kind: str, request_id: str, cluster_id: str, version: str, node_pool: str
    ) -> _Unary:
        """The RPC and request of a mutation named by its ITEM_RPCS key."""
        if kind == "service_out":
            return self._service_out(request_id, cluster_id)
        if kind == "service_in":
            return self._service_in(request_id, cluster_id)
        if kind == "upgrade_control_plane":
            return self._upgrade_control_plane(request_id, cluster_id, version)
        if kind == "upgrade_node_pool":
            return self._upgrade_node_pool(request_id, cluster_id, node_pool, version)
        raise ValueError(f"kind: {kind!r} is not one of {sorted(ITEM_RPCS)}")

    def _service_out(self, request_id: str, cluster_id: str) -> _Unary:
        return (
            self._cluster.ServiceOut,
            cluster_pb2.ServiceOutRequest(request_id=request_id, cluster_id=cluster_id),
        )

    def _service_in(self, request_id: str, cluster_id: str) -> _Unary:
        return (
            self._cluster.ServiceIn,
            cluster_pb2.ServiceInRequest(request_id=request_id, cluster_id=cluster_id),
        )

    def _upgrade_control_plane(self, request_id: str, cluster_id: str, version: str) -> _Unary:
        request = cluster_pb2.UpgradeControlPlaneRequest(
            request_id=request_id, cluster_id=cluster_id, version=version
        )
        return self._cluster.UpgradeControlPlane, request

    def _upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str
    ) -> _Unary:
        request = cluster_pb2.UpgradeNodePoolRequest(
            request_id=request_id, cluster_id=cluster_id, node_pool=node_pool, version=version
        )
        return self._cluster.UpgradeNodePool, request

    def get_operation(self, operation_id: str) -> cluster_pb2.Operation:
        """An operation's current state."""
        request = cluster_pb2.GetOperationRequest(operation_id=operation_id)
        return self._unary("GetOperation", self._cluster.GetOperation, request).operation

    def watch_operations(
        self,
        cluster_ids: Sequence[str] = (),
        include_in_flight: bool = True,
        state_changes_only: bool = False,
        ends_only: bool = False,
    ) -> OperationWatch:
        """Streams operation updates (of cluster_ids, or all) until cancel(); with
        state_changes_only, the plugin may leave out updates of progress alone; with
        ends_only, every live update short of an operation's end."""
        request = cluster_pb2.WatchOperationsRequest(
            cluster_ids=list(cluster_ids),
            include_in_flight=include_in_flight,
            state_changes_only=state_changes_only,
            ends_only=ends_only,
        )
        call = self._cluster.WatchOperations(request, metadata=self._metadata)
        return OperationWatch(self, "WatchOperations", call, _operation_of)

    def watch_operation_changes(
        self,
        cluster_ids: Sequence[str] = (),
        *,
        since_revision: int = 0,
        include_in_flight: bool = True,
    ) -> OperationChangeWatch:
        """Streams WatchOperationsResponse (operation, revision, resync) until cancel().

        Pass the last revision seen as since_revision to resume after a disconnect: the
        plugin replays what changed since, or answers resync=True on the first response
        (then re-read what you care about with GetOperation).
        """
        request = cluster_pb2.WatchOperationsRequest(
            cluster_ids=list(cluster_ids),
            include_in_flight=include_in_flight,
            since_revision=since_revision,
        )
        call = self._cluster.WatchOperations(request, metadata=self._metadata)
        return OperationChangeWatch(self, "WatchOperations", call, _identity)

    def preflight_upgrade(
        self,
        cluster_id: str,
        control_plane_version: str = "",
        node_pool_versions: Mapping[str, str] | None = None,
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """Whether the plugin would accept upgrading the cluster to these versions now.

        Read-only: starts nothing. Needs PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE (UNIMPLEMENTED
        otherwise). The verdict is ACCEPTED, REFUSED_LATER (retry_after_seconds) or
        REFUSED_NEVER, with reason_code and message when refused.
        """
        call = self._preflight(cluster_id, control_plane_version, node_pool_versions)
        response: cluster_pb2.PreflightUpgradeResponse = self._unary("PreflightUpgrade", *call)
        return response

    def start_preflight_upgrade(
        self,
        cluster_id: str,
        control_plane_version: str = "",
        node_pool_versions: Mapping[str, str] | None = None,
    ) -> PendingCall[cluster_pb2.PreflightUpgradeResponse]:
        """preflight_upgrade, started; result() is the answer."""
        call = self._preflight(cluster_id, control_plane_version, node_pool_versions)
        return self._start("PreflightUpgrade", *call, _identity)

    def preflight_request(
        self,
        cluster_id: str,
        control_plane_version: str = "",
        node_pool_versions: Mapping[str, str] | None = None,
    ) -> cluster_pb2.PreflightUpgradeRequest:
        """One PreflightUpgrades item: the request preflight_upgrade would send."""
        request: cluster_pb2.PreflightUpgradeRequest = self._preflight(
            cluster_id, control_plane_version, node_pool_versions
        )[1]
        return request

    def _preflight(
        self,
        cluster_id: str,
        control_plane_version: str,
        node_pool_versions: Mapping[str, str] | None,
    ) -> _Unary:
        request = cluster_pb2.PreflightUpgradeRequest(
            cluster_id=cluster_id,
            control_plane_version=control_plane_version,
            node_pool_versions=dict(node_pool_versions or {}),
        )
        return self._cluster.PreflightUpgrade, request

    # -- HealthService -------------------------------------------------------------------

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), clusters in request order."""
        request = health_pb2.CheckWorkloadsRequest(
            cluster_ids=list(cluster_ids), workloads=list(workloads)
        )
        return list(self._unary("CheckWorkloads", self._health.CheckWorkloads, request).results)

    def query_metric(
        self, query: str, args: Mapping[str, str], cluster_id: str = ""
    ) -> health_pb2.QueryMetricResponse:
        """Runs a provider query with template args; has_data=False when nothing matched."""
        request = health_pb2.QueryMetricRequest(query=query, args=dict(args), cluster_id=cluster_id)
        return self._unary("QueryMetric", self._health.QueryMetric, request)

    # -- GateService ---------------------------------------------------------------------

    def list_gates(self) -> list[gate_pb2.Gate]:
        """Every gate the plugin knows, pending first."""
        response = self._unary("ListGates", self._gate.ListGates, gate_pb2.ListGatesRequest())
        return list(response.gates)

    def watch_gates(self) -> GateWatch:
        """Streams gate changes (starting with every pending gate) until cancel()."""
        call = self._gate.WatchGates(gate_pb2.WatchGatesRequest(), metadata=self._metadata)
        return GateWatch(self, "WatchGates", call, _identity)

    def resolve_gate(self, gate_id: str, decision: int, reason: str) -> gate_pb2.Gate:
        """Approves or rejects a gate (GateDecision value) with a reason for people."""
        request = gate_pb2.ResolveGateRequest(
            gate_id=gate_id,
            decision=decision,  # type: ignore[arg-type]
            reason=reason,
        )
        return self._unary("ResolveGate", self._gate.ResolveGate, request).gate

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; streams in progress end with an error."""
        self._channel.close()

    def __enter__(self) -> PluginClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _operation_of(response: Any) -> cluster_pb2.Operation:
    """The operation of a WatchOperationsResponse or of a mutation's answer."""
    operation: cluster_pb2.Operation = response.operation
    return operation
