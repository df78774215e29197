"""A plugin server of the original multicluster-upgrade-operator for tests: the `plugin.Cluster`
service over real gRPC, with a small model of clusters whose operations take a few ticks.

Written by us from the wire shape (../shared/REFERENCE.md, "The original operator's plugin
proto, on the wire") through our own .proto of the original package (plugins/legacy/proto/).
What the model does mirrors what the original expects of a plugin server:
- Operation types "SERVICE_IN", "SERVICE_OUT", "UPGRADE_MASTER", "UPGRADE_NODE_POOL", fresh
  UUID operation ids, RUNNING until the work is done, then DONE and the cluster changed
  (the original's controllers/mock_operator_test.go).
- GetOperationStatus of an id the server does not know answers UNKNOWN, which the original
  controller logs and waits on (controllers/clusterversion_controller.go,
  reconcileOperationStatus).
- An unknown cluster is a plain Go error on the wire: code UNKNOWN, message "not found"
  (mock_operator_test.go returns errors.New("not found"); grpc-go sends a non-status error as
  UNKNOWN).
- No request ids: every mutating call starts a new operation, so duplicates are visible in
  `started` (the original plugin contract has no idempotency).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from google.protobuf import empty_pb2

from plugins.legacy._gen import plugin_pb2, plugin_pb2_grpc

SERVICE_IN = "SERVICE_IN"
SERVICE_OUT = "SERVICE_OUT"
UPGRADE_MASTER = "UPGRADE_MASTER"
UPGRADE_NODE_POOL = "UPGRADE_NODE_POOL"


@dataclass
class LegacyCluster:
    """One cluster as the original plugin sees it."""

    id: str
    master: str
    pools: dict[str, str]
    service_in: bool = True
    available: bool = True


@dataclass
class LegacyOperation:
    """One operation a mutating call started."""

    id: str
    type: str
    cluster_id: str
    node_pool: str = ""
    version: str = ""
    ticks_left: int = 3
    status: int = plugin_pb2.RUNNING
    fail: bool = False


@dataclass
class Started:
    """A record of one mutating call the server accepted (the world's history)."""

    type: str
    cluster_id: str
    node_pool: str = ""
    version: str = ""


@dataclass
class LegacyModel:
    """Clusters, operations and the history of accepted mutations; safe from any thread."""

    clusters: dict[str, LegacyCluster]
    ticks_per_operation: int = 3
    operations: dict[str, LegacyOperation] = field(default_factory=dict)
    started: list[Started] = field(default_factory=list)
    fail_types: set[tuple[str, str]] = field(default_factory=set)  # (type, cluster) fails once
    refuse: dict[str, grpc.StatusCode] = field(default_factory=dict)  # rpc → code, every call
    delay: dict[str, float] = field(default_factory=dict)  # rpc → seconds before it acts
    peers: set[str] = field(default_factory=set)  # client addresses seen (one per connection)
    synchronous: set[str] = field(default_factory=set)  # types done at once, no operationID
    lock: threading.Lock = field(default_factory=threading.Lock)
    min_serving: int = -1  # fewest clusters available and in service at once (-1: not yet seen)

    def __post_init__(self) -> None:
        self.min_serving = self._serving()

    def _serving(self) -> int:
        return sum(1 for c in self.clusters.values() if c.available and c.service_in)

    def tick(self) -> None:
        """Advances every RUNNING operation by one tick; finished ones change their cluster."""
        with self.lock:
            for op in self.operations.values():
                if op.status != plugin_pb2.RUNNING:
                    continue
                op.ticks_left -= 1
                if op.ticks_left > 0:
                    continue
                if op.fail:
                    op.status = plugin_pb2.FAILED
                    continue
                self._apply(op)
            self.min_serving = min(self.min_serving, self._serving())

    def _apply(self, op: LegacyOperation) -> None:
        cluster = self.clusters[op.cluster_id]
        if op.type == SERVICE_IN:
            cluster.service_in = True
        elif op.type == SERVICE_OUT:
            cluster.service_in = False
        elif op.type == UPGRADE_MASTER:
            cluster.master = op.version
        else:
            cluster.pools[op.node_pool] = op.version
        op.status = plugin_pb2.DONE

    def forget_operations(self) -> None:
        """Drops every operation, as a plugin server restarted without memory would."""
        with self.lock:
            self.operations.clear()

    def fail_next(self, op_type: str, cluster_id: str) -> None:
        """The next operation of this type on this cluster ends FAILED (once)."""
        with self.lock:
            self.fail_types.add((op_type, cluster_id))

    def count(self, op_type: str, cluster_id: str | None = None) -> int:
        """How many operations of this type the server accepted (on one cluster or all)."""
        with self.lock:
            return sum(
                1
                for s in self.started
                if s.type == op_type and (cluster_id is None or s.cluster_id == cluster_id)
            )

    def snapshot(self, cluster_id: str) -> LegacyCluster:
        """A copy of one cluster now."""
        with self.lock:
            c = self.clusters[cluster_id]
            return LegacyCluster(c.id, c.master, dict(c.pools), c.service_in, c.available)

    def running(self) -> int:
        """Operations still RUNNING."""
        with self.lock:
            return sum(1 for op in self.operations.values() if op.status == plugin_pb2.RUNNING)

    def start(
        self, op_type: str, cluster_id: str, node_pool: str = "", version: str = ""
    ) -> plugin_pb2.Operation:
        with self.lock:
            op = LegacyOperation(
                id=str(uuid.uuid4()),
                type=op_type,
                cluster_id=cluster_id,
                node_pool=node_pool,
                version=version,
                ticks_left=self.ticks_per_operation,
                fail=(op_type, cluster_id) in self.fail_types,
            )
            self.fail_types.discard((op_type, cluster_id))
            self.started.append(Started(op_type, cluster_id, node_pool, version))
            if op_type in self.synchronous:
                # Done before answering, with no operation to follow: the original controller
                # treats an empty operationID as nothing in flight (Reconcile checks
                # Status.OperationID != "").
                self._apply(op)
                self.min_serving = min(self.min_serving, self._serving())
                return plugin_pb2.Operation(type=op.type)
            self.operations[op.id] = op
            return plugin_pb2.Operation(type=op.type, operationID=op.id)


def legacy_fleet(
    ids: list[str], version: str, pools: tuple[str, ...] = ("default-pool",)
) -> dict[str, LegacyCluster]:
    """Clusters at one version, each with the given node pools, in service and available."""
    return {i: LegacyCluster(i, version, dict.fromkeys(pools, version)) for i in ids}


class LegacyServicer(plugin_pb2_grpc.ClusterServicer):
    """The original `plugin.Cluster` service over a LegacyModel."""

    def __init__(self, model: LegacyModel) -> None:
        self.model = model

    def _check(self, rpc: str, context: grpc.ServicerContext) -> None:
        with self.model.lock:
            self.model.peers.add(context.peer())
        pause = self.model.delay.get(rpc)
        if pause:
            time.sleep(pause)  # a slow plugin server: the work starts after the pause
        code = self.model.refuse.get(rpc)
        if code is not None:
            context.abort(code, f"{rpc} refused by the test")

    def _cluster(self, cluster_id: str, context: grpc.ServicerContext) -> LegacyCluster:
        cluster = self.model.clusters.get(cluster_id)
        if cluster is None:
            context.abort(grpc.StatusCode.UNKNOWN, "not found")
        assert cluster is not None
        return cluster

    def HealthCheck(
        self, request: empty_pb2.Empty, context: grpc.ServicerContext
    ) -> empty_pb2.Empty:
        self._check("HealthCheck", context)
        return empty_pb2.Empty()

    def GetVersion(
        self, request: plugin_pb2.GetVersionRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.ClusterVersion:
        self._check("GetVersion", context)
        with self.model.lock:
            c = self._cluster(request.clusterID, context)
            return plugin_pb2.ClusterVersion(
                master=plugin_pb2.MasterVersion(clusterID=c.id, version=c.master),
                nodePools=[
                    plugin_pb2.NodePoolVersion(clusterID=c.id, nodePoolID=p, version=v)
                    for p, v in c.pools.items()
                ],
            )

    def GetClusterStatus(
        self, request: plugin_pb2.GetClusterStatusRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.ClusterStatus:
        self._check("GetClusterStatus", context)
        with self.model.lock:
            c = self._cluster(request.clusterID, context)
            status = plugin_pb2.STATUS_SERVICE_IN if c.service_in else plugin_pb2.STATUS_SERVICE_OUT
            return plugin_pb2.ClusterStatus(status=status, isAvailable=c.available)

    def GetOperationStatus(
        self, request: plugin_pb2.GetOperationStatusRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.OperationStatus:
        self._check("GetOperationStatus", context)
        with self.model.lock:
            op = self.model.operations.get(request.operationID)
            if op is None or op.cluster_id != request.clusterID or op.type != request.type:
                return plugin_pb2.OperationStatus(status=plugin_pb2.UNKNOWN)
            return plugin_pb2.OperationStatus(status=op.status)  # type: ignore[arg-type]

    def ServiceIn(
        self, request: plugin_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.Operation:
        self._check("ServiceIn", context)
        with self.model.lock:
            self._cluster(request.clusterID, context)
        return self.model.start(SERVICE_IN, request.clusterID)

    def ServiceOut(
        self, request: plugin_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.Operation:
        self._check("ServiceOut", context)
        with self.model.lock:
            self._cluster(request.clusterID, context)
        return self.model.start(SERVICE_OUT, request.clusterID)

    def UpgradeMaster(
        self, request: plugin_pb2.MasterVersion, context: grpc.ServicerContext
    ) -> plugin_pb2.Operation:
        self._check("UpgradeMaster", context)
        with self.model.lock:
            self._cluster(request.clusterID, context)
        return self.model.start(UPGRADE_MASTER, request.clusterID, version=request.version)

    def UpgradeNodePool(
        self, request: plugin_pb2.NodePoolVersion, context: grpc.ServicerContext
    ) -> plugin_pb2.Operation:
        self._check("UpgradeNodePool", context)
        with self.model.lock:
            c = self._cluster(request.clusterID, context)
            if request.nodePoolID not in c.pools:
                context.abort(grpc.StatusCode.UNKNOWN, "node pool not found")
        return self.model.start(
            UPGRADE_NODE_POOL, request.clusterID, request.nodePoolID, request.version
        )


class LegacyServer:
    """The servicer on 127.0.0.1 (port 0 picks one), and a ticker advancing the model.

    stop() and start() again keep the model and the port (an upstream that went away and came
    back); the ticker runs while the server is up.
    """

    def __init__(
        self,
        model: LegacyModel,
        tick_seconds: float = 0.05,
        port: int = 0,
        tls: grpc.ServerCredentials | None = None,
    ) -> None:
        self.model = model
        self.tick_seconds = tick_seconds
        self.port = port
        self.tls = tls
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LegacyServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        plugin_pb2_grpc.add_ClusterServicer_to_server(LegacyServicer(self.model), server)
        address = f"127.0.0.1:{self.port}"
        if self.tls is None:
            self.port = server.add_insecure_port(address)
        else:
            self.port = server.add_secure_port(address, self.tls)
        assert self.port, "the legacy test server could not bind"
        server.start()
        self._server = server
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="legacy-ticker", daemon=True)
        self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            self.model.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None


@contextmanager
def legacy_server(
    clusters: dict[str, LegacyCluster],
    *,
    ticks: int = 3,
    tick_seconds: float = 0.05,
    tls: grpc.ServerCredentials | None = None,
) -> Iterator[LegacyServer]:
    """A started LegacyServer over these clusters (TLS with server credentials); stopped on exit."""
    model = LegacyModel(clusters, ticks_per_operation=ticks)
    server = LegacyServer(model, tick_seconds, tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()
