"""ClusterService and HealthService for any plugin: request checks here, the work in a backend."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc, health_pb2, health_pb2_grpc
from plugins.sdk.client import ITEM_RPCS
from plugins.sdk.errors import (
    InvalidArgument,
    PluginError,
    Reason,
    Unimplemented,
    status_code,
    status_proto,
)
from plugins.sdk.interceptors import CALLER_METADATA_KEY, INTERNAL_MESSAGE, context_code
from plugins.sdk.operations import open_cursor, release_cursor
from plugins.sdk.validate import check_version, require, require_all, require_request_id

__all__ = [
    "BeforeCall",
    "ClusterBackend",
    "ClusterServicer",
    "HealthBackend",
    "HealthServicer",
    "ItemRecorder",
    "ListsChanges",
    "PreflightBackend",
    "caller_of",
]

_LOG = logging.getLogger("plugins.sdk.rpc")

#: The most items one batch call (StartOperations, PreflightUpgrades) may carry (the contract's).
MAX_OPERATION_ITEMS = 1000

T = TypeVar("T")

#: Operation states after which an operation changes no more.
_TERMINAL = frozenset({cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED})

BeforeCall = Callable[[str, grpc.ServicerContext], None]
"""Runs first in every RPC with the RPC's name (e.g. "ListClusters"); may raise or abort.

The sim injects its faults here.
"""


def caller_of(context: grpc.ServicerContext) -> str:
    """The caller's identity: metadata x-fleetupgrade-caller, else the peer address."""
    for key, value in context.invocation_metadata() or ():
        if key == CALLER_METADATA_KEY and value:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return f"peer:{context.peer()}"


@runtime_checkable
class ListsChanges(Protocol):
    """A ClusterBackend that keeps its inventory's revisions (ListClustersResponse.revision)
    and lists what changed since one (ListClustersRequest.changed_since); one that cannot
    answer since that revision lists every cluster, changes_only false."""

    def list_changes(
        self,
        changed_since: str,
        page_size: int,
        page_token: str,
        match_labels: Mapping[str, str],
        /,
    ) -> cluster_pb2.ListClustersResponse: ...


class ClusterBackend(Protocol):
    """What ClusterServicer delegates to, with the request fields already checked.

    Mutating methods get the caller identity (caller_of) last; a backend may ignore it. A
    backend without an RPC (outside its declared capabilities) raises Unimplemented there.
    watch_operations that returns OperationStore.watch(...) with the call's context is
    resumable (since_revision, revisions, resync) with nothing more to do.

    A backend that keeps the inventory's revisions also has `list_changes` (`ListsChanges`):
    ListClusters with changed_since goes there; without it, changed_since is ignored and
    every cluster is listed (changes_only false), as the contract allows.
    """

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str], /
    ) -> cluster_pb2.ListClustersResponse: ...

    def get_cluster(self, cluster_id: str, /) -> cluster_pb2.GetClusterResponse: ...

    def service_out(
        self, request_id: str, cluster_id: str, caller: str, /
    ) -> cluster_pb2.Operation: ...

    def service_in(
        self, request_id: str, cluster_id: str, caller: str, /
    ) -> cluster_pb2.Operation: ...

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str, /
    ) -> cluster_pb2.Operation: ...

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str, /
    ) -> cluster_pb2.Operation: ...

    def get_operation(self, operation_id: str, /) -> cluster_pb2.Operation: ...

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext, /
    ) -> Iterable[cluster_pb2.Operation]: ...


class PreflightBackend(Protocol):
    """The optional method of a ClusterBackend that answers PreflightUpgrade.

    Gets the request checked (cluster_id set, versions parse, at least one target) and
    answers a verdict (plugins/sdk/preflight.py builds them); raises NotFound for an unknown
    cluster or node pool, Unavailable when the provider cannot be asked. It must not start
    or change anything.
    """

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str], /
    ) -> cluster_pb2.PreflightUpgradeResponse: ...


class HealthBackend(Protocol):
    """What HealthService delegates to, with the request fields already checked."""

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload], /
    ) -> list[health_pb2.WorkloadResult]: ...

    def query_metric(
        self, query: str, args: Mapping[str, str], cluster_id: str, /
    ) -> health_pb2.QueryMetricResponse: ...


def _nothing_before(method: str, context: grpc.ServicerContext) -> None:
    return None


class ClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """ClusterService: checks the fields the contract makes REQUIRED, then asks the backend.

    PreflightUpgrade goes to the backend's optional preflight_upgrade (PreflightBackend);
    without one it answers UNIMPLEMENTED (declare PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE only
    with it).
    """

    def __init__(self, backend: ClusterBackend, before: BeforeCall | None = None) -> None:
        self._backend = backend
        self._before = before or _nothing_before
        #: The mutating RPCs outside the declared capabilities (serve() says which): a
        #: StartOperations item of one answers UNIMPLEMENTED, as the RPC itself would.
        self._refused: dict[str, str] = {}
        #: Where each StartOperations item is logged and counted as its own RPC (serve()).
        self._record_item: ItemRecorder | None = None

    def serve_items(self, refused: Mapping[str, str], record: ItemRecorder | None) -> None:
        """How StartOperations treats its items as the RPCs they stand for: refused (by name,
        e.g. "UpgradeNodePool", with the words their refusal answers) as outside the
        capabilities, and each logged and counted by record, as the server's interceptor does
        each RPC (so that a plugin's counts per RPC are the same batched or not)."""
        self._refused = dict(refused)
        self._record_item = record

    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        self._before("ListClusters", context)
        if request.changed_since and isinstance(self._backend, ListsChanges):
            return self._backend.list_changes(
                request.changed_since, request.page_size, request.page_token, request.match_labels
            )
        return self._backend.list_clusters(
            request.page_size, request.page_token, request.match_labels
        )

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        self._before("GetCluster", context)
        return self._backend.get_cluster(require("cluster_id", request.cluster_id))

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        self._before("ServiceOut", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        op = self._backend.service_out(request_id, cluster_id, caller_of(context))
        return cluster_pb2.ServiceOutResponse(operation=op)

    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        self._before("ServiceIn", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        op = self._backend.service_in(request_id, cluster_id, caller_of(context))
        return cluster_pb2.ServiceInResponse(operation=op)

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        self._before("UpgradeControlPlane", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        version = check_version("version", request.version)
        op = self._backend.upgrade_control_plane(
            request_id, cluster_id, version, caller_of(context)
        )
        return cluster_pb2.UpgradeControlPlaneResponse(operation=op)

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        self._before("UpgradeNodePool", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        node_pool = require("node_pool", request.node_pool)
        version = check_version("version", request.version)
        op = self._backend.upgrade_node_pool(
            request_id, cluster_id, node_pool, version, caller_of(context)
        )
        return cluster_pb2.UpgradeNodePoolResponse(operation=op)

    def GetOperation(
        self, request: cluster_pb2.GetOperationRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetOperationResponse:
        self._before("GetOperation", context)
        op = self._backend.get_operation(require("operation_id", request.operation_id))
        return cluster_pb2.GetOperationResponse(operation=op)

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        self._before("WatchOperations", context)
        cluster_ids = list(request.cluster_ids)
        for index, cluster_id in enumerate(cluster_ids):
            require(f"cluster_ids[{index}]", cluster_id)
        if request.since_revision < 0:
            raise InvalidArgument(
                "since_revision", "must be 0 or a revision a WatchOperations response carried"
            )
        # An OperationStore behind the backend picks the cursor up (replay, revisions). A
        # backend without one gets numbered responses: revisions of this stream only, so a
        # since_revision can never be replayed and the first response says resync.
        cursor = open_cursor(context, request.since_revision)
        numbered = 0
        # state_changes_only: the state last sent for each operation in flight on this stream.
        sent: dict[str, int] | None = {} if request.state_changes_only else None
        ends_only = request.ends_only
        try:
            for op in self._backend.watch_operations(
                cluster_ids, request.include_in_flight, context
            ):
                if ends_only and cursor.served and cursor.live and op.state not in _TERMINAL:
                    # ends_only: a live update short of the end (a backend without an
                    # OperationStore cannot tell live from the stream's start: all are sent).
                    continue
                if sent is not None:
                    resync = (
                        cursor.resync
                        if cursor.served
                        else not numbered and request.since_revision != 0
                    )
                    if not resync and sent.get(op.id) == op.state:
                        continue  # progress only
                    if op.state in _TERMINAL:
                        sent.pop(op.id, None)
                    else:
                        sent[op.id] = op.state
                if cursor.served:
                    yield cluster_pb2.WatchOperationsResponse(
                        operation=op, revision=cursor.revision, resync=cursor.resync
                    )
                    continue
                numbered += 1
                yield cluster_pb2.WatchOperationsResponse(
                    operation=op,
                    revision=numbered,
                    resync=numbered == 1 and request.since_revision != 0,
                )
        finally:
            release_cursor(context)

    def StartOperations(
        self, request: cluster_pb2.StartOperationsRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.StartOperationsResponse:
        """Each item answered by this servicer's own method for it (a subclass's included),
        in order, its error kept to it (the contract's StartOperations)."""
        self._before("StartOperations", context)
        results = []
        for index, item in enumerate(_bounded(request.requests, "an OperationRequest")):
            which = item.WhichOneof("request")
            if which is None:
                answer, error, operation_id = self._item(
                    "StartOperations", None, partial(_unset, index), index, context
                )
            else:
                method = ITEM_RPCS[which]
                answer, error, operation_id = self._item(
                    "StartOperations",
                    method,
                    partial(getattr(self, method), getattr(item, which), context),
                    index,
                    context,
                )
            if error is None:
                results.append(cluster_pb2.OperationResult(operation=answer.operation))
            else:
                results.append(cluster_pb2.OperationResult(error=error, operation_id=operation_id))
        return cluster_pb2.StartOperationsResponse(results=results)

    def PreflightUpgrades(
        self, request: cluster_pb2.PreflightUpgradesRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.PreflightUpgradesResponse:
        """Each item answered by this servicer's PreflightUpgrade (a subclass's included), in
        order, its error kept to it (the contract's PreflightUpgrades)."""
        self._before("PreflightUpgrades", context)
        results = []
        for index, item in enumerate(_bounded(request.requests, "a PreflightUpgradeRequest")):
            answer, error, _ = self._item(
                "PreflightUpgrades",
                "PreflightUpgrade",
                partial(self.PreflightUpgrade, item, context),
                index,
                context,
            )
            if error is None:
                results.append(cluster_pb2.PreflightResult(verdict=answer))
            else:
                results.append(cluster_pb2.PreflightResult(error=error))
        return cluster_pb2.PreflightUpgradesResponse(results=results)

    def _item(
        self,
        batch: str,
        method: str | None,
        answer: Callable[[], Any],
        index: int,
        context: grpc.ServicerContext,
    ) -> tuple[Any, cluster_pb2.ItemStatus | None, str]:
        """One item of a batch call, answered as its own RPC (method; None: an item that names
        none) would answer it: (its answer, None, "") or (None, its error, the in-flight
        operation's id an ABORTED names); refused as the RPC when it is outside the declared
        capabilities, and logged and counted as the RPC (`serve_items`)."""
        start = time.perf_counter()
        operation_id = ""
        try:
            refused = self._refused.get(method or "")
            if refused is not None:
                raise Unimplemented(refused)
            value = answer()
        except PluginError as err:
            status = err.status()
            operation_id = str(getattr(err, "operation_id", "") or "")
        except Exception:
            if context_code(context) not in (None, grpc.StatusCode.OK):
                raise  # the servicer aborted the call itself: its status stands for all
            _LOG.exception("%s item %d (%s) raised", batch, index, method)
            status = status_proto(
                grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, reason=Reason.INTERNAL
            )
        else:
            self._record(method, context, start, None)
            return value, None, ""
        error = cluster_pb2.ItemStatus(code=status.code, message=status.message)
        error.details.extend(status.details)
        self._record(method, context, start, error)
        return None, error, operation_id

    def _record(
        self,
        method: str | None,
        context: grpc.ServicerContext,
        start: float,
        error: cluster_pb2.ItemStatus | None,
    ) -> None:
        """Log and count an item as its own RPC (`serve_items`)."""
        if self._record_item is not None and method is not None:
            code = grpc.StatusCode.OK if error is None else status_code(error.code)
            message = "" if error is None else error.message
            self._record_item(
                f"ClusterService/{method}",
                caller_of(context),
                code,
                message,
                time.perf_counter() - start,
            )

    def PreflightUpgrade(
        self, request: cluster_pb2.PreflightUpgradeRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.PreflightUpgradeResponse:
        self._before("PreflightUpgrade", context)
        cluster_id = require("cluster_id", request.cluster_id)
        control_plane = request.control_plane_version
        if control_plane:
            check_version("control_plane_version", control_plane)
        pools: dict[str, str] = {}
        for name in sorted(request.node_pool_versions):
            if not name:
                raise InvalidArgument(
                    "node_pool_versions", "has an empty node pool name; use names from node_pools"
                )
            pools[name] = check_version(
                f"node_pool_versions[{name}]", request.node_pool_versions[name]
            )
        if not control_plane and not pools:
            raise InvalidArgument(
                "control_plane_version",
                "must not be empty when node_pool_versions is empty; set the target version(s)",
            )
        preflight = getattr(self._backend, "preflight_upgrade", None)
        if preflight is None:
            raise Unimplemented("PreflightUpgrade is not implemented by this plugin")
        response: cluster_pb2.PreflightUpgradeResponse = preflight(cluster_id, control_plane, pools)
        return response


def _bounded(items: Sequence[T], kind: str) -> Sequence[T]:
    """A batch call's items, within the contract's bounds (else INVALID_ARGUMENT)."""
    if not items:
        raise InvalidArgument("requests", f"must not be empty; add {kind}")
    if len(items) > MAX_OPERATION_ITEMS:
        raise InvalidArgument(
            "requests",
            f"has {len(items)} items, more than {MAX_OPERATION_ITEMS}; split the batch",
        )
    return items


def _unset(index: int) -> NoReturn:
    raise InvalidArgument(
        f"requests[{index}]",
        "sets none of service_out, service_in, upgrade_control_plane, upgrade_node_pool; set one",
    )


ItemRecorder = Callable[[str, str, grpc.StatusCode, str, float], None]
"""Logs and counts one StartOperations item as its own RPC: (method as the interceptor names
it, e.g. "ClusterService/ServiceOut", caller, code, message, seconds)."""


class HealthServicer(health_pb2_grpc.HealthServiceServicer):
    """HealthService: checks the fields the contract makes REQUIRED, then asks the backend."""

    def __init__(self, backend: HealthBackend, before: BeforeCall | None = None) -> None:
        self._backend = backend
        self._before = before or _nothing_before

    def CheckWorkloads(
        self, request: health_pb2.CheckWorkloadsRequest, context: grpc.ServicerContext
    ) -> health_pb2.CheckWorkloadsResponse:
        self._before("CheckWorkloads", context)
        cluster_ids = require_all("cluster_ids", request.cluster_ids)
        if not request.workloads:
            require("workloads", "")
        for index, workload in enumerate(request.workloads):
            require(f"workloads[{index}].namespace", workload.namespace)
            require(f"workloads[{index}].name", workload.name)
        results = self._backend.check_workloads(cluster_ids, request.workloads)
        return health_pb2.CheckWorkloadsResponse(results=results)

    def QueryMetric(
        self, request: health_pb2.QueryMetricRequest, context: grpc.ServicerContext
    ) -> health_pb2.QueryMetricResponse:
        self._before("QueryMetric", context)
        query = require("query", request.query)
        return self._backend.query_metric(query, request.args, request.cluster_id)
