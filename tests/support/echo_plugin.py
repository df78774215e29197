"""A tiny, contract-following plugin for tests of the SDK server, client and conformance kit.

It leaves capability checks to the SDK server (serve() refuses RPCs outside them).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

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
from plugins.sdk import preflight, validate, versions
from plugins.sdk.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from plugins.sdk.operations import OperationStore
from plugins.sdk.revisions import RevisionLog
from plugins.sdk.server import (
    PluginServicers,
    add_server_args,
    configure_logging,
    run_until_signal,
    serve,
    server_tls_from_args,
)

__all__ = [
    "ALL_CAPABILITIES",
    "EchoCluster",
    "EchoFleet",
    "EchoGate",
    "EchoHealth",
    "EchoIdentity",
    "echo_servicers",
    "main",
]

Cap = identity_pb2.PluginCapability
ALL_CAPABILITIES: frozenset[int] = frozenset(
    v for v in identity_pb2.PluginCapability.values() if v != Cap.PLUGIN_CAPABILITY_UNSPECIFIED
)
SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
RUNNING = cluster_pb2.OPERATION_STATE_RUNNING


@dataclass
class EchoFleet:
    """The clusters of the echo plugin, guarded by one lock."""

    clusters: dict[str, cluster_pb2.Cluster] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The inventory's revisions (ListClusters changed_since), the SDK's.
    revisions: RevisionLog = field(default_factory=RevisionLog)

    def touch(self, cluster_id: str) -> None:
        """A cluster changed (under the lock)."""
        self.revisions.touch(cluster_id)

    @classmethod
    def generate(cls, count: int, version: str = "1.29.4") -> EchoFleet:
        """count clusters named echo-000.., every second one labelled stage=canary."""
        fleet = cls()
        for index in range(count):
            cluster_id = f"echo-{index:03d}"
            fleet.clusters[cluster_id] = cluster_pb2.Cluster(
                id=cluster_id,
                labels={"stage": "canary" if index % 2 == 0 else "prod"},
                control_plane_version=version,
                node_pools=[
                    cluster_pb2.NodePool(
                        name="pool-a", version=version, status=cluster_pb2.NODE_POOL_STATUS_READY
                    )
                ],
                available=True,
                in_service=True,
            )
        return fleet

    def get(self, cluster_id: str) -> cluster_pb2.Cluster:
        """A copy of the cluster; NotFound when unknown."""
        validate.require("cluster_id", cluster_id)
        with self.lock:
            cluster = self.clusters.get(cluster_id)
            if cluster is None:
                raise NotFound(f"cluster {cluster_id} not found; list clusters to see the ids")
            copy = cluster_pb2.Cluster()
            copy.CopyFrom(cluster)
            return copy


class EchoIdentity(identity_pb2_grpc.IdentityServiceServicer):
    """Identity of the echo plugin with a configurable capability set."""

    def __init__(self, capabilities: frozenset[int] = ALL_CAPABILITIES) -> None:
        self.capabilities = capabilities

    def GetPluginInfo(
        self, request: identity_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> identity_pb2.GetPluginInfoResponse:
        return identity_pb2.GetPluginInfoResponse(
            name="echo.test.fleetupgrade.io", vendor_version="0.1.0"
        )

    def GetPluginCapabilities(
        self, request: identity_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> identity_pb2.GetPluginCapabilitiesResponse:
        return identity_pb2.GetPluginCapabilitiesResponse(capabilities=sorted(self.capabilities))  # type: ignore[arg-type]

    def Probe(
        self, request: identity_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> identity_pb2.ProbeResponse:
        return identity_pb2.ProbeResponse(ready=True)


class EchoCluster(cluster_pb2_grpc.ClusterServiceServicer):
    """Inventory and operations; each change takes op_seconds (0: every change is immediate)."""

    def __init__(self, fleet: EchoFleet, store: OperationStore, op_seconds: float = 0.3) -> None:
        self.fleet = fleet
        self.store = store
        self.op_seconds = op_seconds

    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        size = validate.check_page_size(request.page_size)
        after = validate.decode_page_token(request.page_token)
        wanted = dict(request.match_labels)
        fleet = self.fleet
        with fleet.lock:
            changed = (
                fleet.revisions.changed_since(request.changed_since)
                if request.changed_since
                else None
            )
            matching = [
                fleet.clusters[cid]
                for cid in (sorted(fleet.clusters) if changed is None else changed)
                if all(fleet.clusters[cid].labels.get(k) == v for k, v in wanted.items())
            ]
            revision = fleet.revisions.revision
        rest = [c for c in matching if c.id > after]
        page = rest[:size]
        token = validate.encode_page_token(page[-1].id) if len(rest) > size else ""
        return cluster_pb2.ListClustersResponse(
            clusters=page,
            next_page_token=token,
            total_size=len(matching),
            revision=revision,
            changes_only=changed is not None,
        )

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        return cluster_pb2.GetClusterResponse(cluster=self.fleet.get(request.cluster_id))

    def _mutate(
        self,
        *,
        request_id: str,
        kind: int,
        cluster_id: str,
        node_pool: str = "",
        version: str = "",
    ) -> cluster_pb2.Operation:
        cluster = self.fleet.get(cluster_id)
        if kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT:
            done = not cluster.in_service
        elif kind == cluster_pb2.OPERATION_KIND_SERVICE_IN:
            done = cluster.in_service
        elif kind == cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE:
            if versions.is_newer(cluster.control_plane_version, version):
                raise FailedPrecondition(
                    f"control plane {cluster.control_plane_version} cannot go back to {version}",
                    reason=Reason.DOWNGRADE_NOT_SUPPORTED,
                )
            done = cluster.control_plane_version == version
        else:
            pools = {p.name: p for p in cluster.node_pools}
            if node_pool not in pools:
                raise NotFound(f"node pool {node_pool} not found in cluster {cluster_id}")
            if versions.parse(version) > versions.parse(cluster.control_plane_version):
                raise FailedPrecondition(
                    f"node pool version {version} is newer than the control plane "
                    f"{cluster.control_plane_version}; upgrade the control plane first"
                )
            done = pools[node_pool].version == version
        op, created = self.store.start(
            request_id=request_id,
            kind=kind,
            cluster_id=cluster_id,
            node_pool=node_pool,
            target_version=version,
            initial_state=SUCCEEDED
            if done or self.op_seconds <= 0
            else cluster_pb2.OPERATION_STATE_PENDING,
        )
        if created and op.state == SUCCEEDED:
            self._apply(op)
        elif created:
            self.store.update(op.id, state=RUNNING, progress=10)
            timer = threading.Timer(self.op_seconds, self._finish, args=(op,))
            timer.daemon = True
            timer.start()
        return op

    def _apply(self, op: cluster_pb2.Operation) -> None:
        with self.fleet.lock:
            cluster = self.fleet.clusters[op.cluster_id]
            self.fleet.touch(op.cluster_id)
            if op.kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT:
                cluster.in_service = False
            elif op.kind == cluster_pb2.OPERATION_KIND_SERVICE_IN:
                cluster.in_service = True
            elif op.kind == cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE:
                cluster.control_plane_version = op.target_version
            else:
                for pool in cluster.node_pools:
                    if pool.name == op.node_pool:
                        pool.version = op.target_version

    def _finish(self, op: cluster_pb2.Operation) -> None:
        self._apply(op)
        self.store.update(op.id, state=SUCCEEDED)

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        validate.require_request_id(request)
        op = self._mutate(
            request_id=request.request_id,
            kind=cluster_pb2.OPERATION_KIND_SERVICE_OUT,
            cluster_id=request.cluster_id,
        )
        return cluster_pb2.ServiceOutResponse(operation=op)

    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        validate.require_request_id(request)
        op = self._mutate(
            request_id=request.request_id,
            kind=cluster_pb2.OPERATION_KIND_SERVICE_IN,
            cluster_id=request.cluster_id,
        )
        return cluster_pb2.ServiceInResponse(operation=op)

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        validate.require_request_id(request)
        validate.require("cluster_id", request.cluster_id)
        validate.check_version("version", request.version)
        op = self._mutate(
            request_id=request.request_id,
            kind=cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
            cluster_id=request.cluster_id,
            version=request.version,
        )
        return cluster_pb2.UpgradeControlPlaneResponse(operation=op)

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        validate.require_request_id(request)
        validate.require("cluster_id", request.cluster_id)
        validate.require("node_pool", request.node_pool)
        validate.check_version("version", request.version)
        op = self._mutate(
            request_id=request.request_id,
            kind=cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL,
            cluster_id=request.cluster_id,
            node_pool=request.node_pool,
            version=request.version,
        )
        return cluster_pb2.UpgradeNodePoolResponse(operation=op)

    def GetOperation(
        self, request: cluster_pb2.GetOperationRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetOperationResponse:
        validate.require("operation_id", request.operation_id)
        return cluster_pb2.GetOperationResponse(operation=self.store.get(request.operation_id))

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        yield from self.store.changes(
            request.cluster_ids, request.include_in_flight, context, request.since_revision
        )

    def PreflightUpgrade(
        self, request: cluster_pb2.PreflightUpgradeRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.PreflightUpgradeResponse:
        # The same rules as _mutate: a busy cluster is refused for now, a node pool newer
        # than its control plane never.
        if not request.control_plane_version and not request.node_pool_versions:
            raise InvalidArgument(
                "control_plane_version", "must not be empty when node_pool_versions is empty"
            )
        cluster = self.fleet.get(request.cluster_id)
        if request.control_plane_version:
            validate.check_version("control_plane_version", request.control_plane_version)
        control_plane = request.control_plane_version or cluster.control_plane_version
        if versions.is_newer(cluster.control_plane_version, control_plane):
            return preflight.refused_never(
                Reason.DOWNGRADE_NOT_SUPPORTED,
                f"control plane {cluster.control_plane_version} cannot go back to {control_plane}",
            )
        pools = {p.name for p in cluster.node_pools}
        for name, version in sorted(request.node_pool_versions.items()):
            validate.check_version(f"node_pool_versions[{name}]", version)
            if name not in pools:
                raise NotFound(f"node pool {name} not found in cluster {cluster.id}")
            if versions.is_newer(version, control_plane):
                return preflight.refused_never(
                    Reason.NODE_POOL_AHEAD_OF_CONTROL_PLANE,
                    f"node pool {name} at {version} would be newer than the control plane "
                    f"{control_plane}; upgrade the control plane first",
                )
        busy = self.store.in_flight(cluster.id)
        if busy is not None:
            return preflight.refused_later(
                Reason.CLUSTER_BUSY, f"operation {busy.id} is in flight", self.op_seconds
            )
        return preflight.accepted()


class EchoHealth(health_pb2_grpc.HealthServiceServicer):
    """Workload verdicts from a fixed table; every metric query has no data."""

    def __init__(self, healthy: Mapping[tuple[str, str, str], int] | None = None) -> None:
        self.healthy = dict(healthy or {})  # (cluster, namespace, name) -> healthy replicas

    def CheckWorkloads(
        self, request: health_pb2.CheckWorkloadsRequest, context: grpc.ServicerContext
    ) -> health_pb2.CheckWorkloadsResponse:
        validate.require_all("cluster_ids", list(request.cluster_ids))
        validate.require_all("workloads", [w.name for w in request.workloads])
        results = []
        for cluster_id in request.cluster_ids:
            for workload in request.workloads:
                replicas = self.healthy.get((cluster_id, workload.namespace, workload.name))
                if replicas is None:
                    health = health_pb2.WORKLOAD_HEALTH_MISSING
                elif replicas >= max(workload.min_healthy_replicas, 1):
                    health = health_pb2.WORKLOAD_HEALTH_HEALTHY
                else:
                    health = health_pb2.WORKLOAD_HEALTH_UNHEALTHY
                results.append(
                    health_pb2.WorkloadResult(
                        cluster_id=cluster_id,
                        workload=workload,
                        health=health,
                        healthy_replicas=replicas or 0,
                    )
                )
        return health_pb2.CheckWorkloadsResponse(results=results)

    def QueryMetric(
        self, request: health_pb2.QueryMetricRequest, context: grpc.ServicerContext
    ) -> health_pb2.QueryMetricResponse:
        validate.require("query", request.query)
        return health_pb2.QueryMetricResponse(has_data=False, message="echo has no metrics")


class EchoGate(gate_pb2_grpc.GateServiceServicer):
    """A fixed set of gates that can be approved or rejected once."""

    def __init__(self, gates: Sequence[gate_pb2.Gate] = ()) -> None:
        self.gates = {g.id: g for g in gates}
        self.lock = threading.Lock()

    def ListGates(
        self, request: gate_pb2.ListGatesRequest, context: grpc.ServicerContext
    ) -> gate_pb2.ListGatesResponse:
        with self.lock:
            ordered = sorted(
                self.gates.values(), key=lambda g: (g.state != gate_pb2.GATE_STATE_PENDING, g.id)
            )
            return gate_pb2.ListGatesResponse(gates=ordered)

    def WatchGates(
        self, request: gate_pb2.WatchGatesRequest, context: grpc.ServicerContext
    ) -> Iterator[gate_pb2.WatchGatesResponse]:
        with self.lock:
            pending = [g for g in self.gates.values() if g.state == gate_pb2.GATE_STATE_PENDING]
        for gate in pending:
            yield gate_pb2.WatchGatesResponse(type=gate_pb2.GATE_EVENT_TYPE_UPSERTED, gate=gate)
        stopped = threading.Event()
        context.add_callback(stopped.set)
        stopped.wait()

    def ResolveGate(
        self, request: gate_pb2.ResolveGateRequest, context: grpc.ServicerContext
    ) -> gate_pb2.ResolveGateResponse:
        validate.require("gate_id", request.gate_id)
        if request.decision == gate_pb2.GATE_DECISION_UNSPECIFIED:
            raise InvalidArgument(
                "decision", "must be GATE_DECISION_APPROVE or GATE_DECISION_REJECT"
            )
        validate.require("reason", request.reason)
        state = (
            gate_pb2.GATE_STATE_APPROVED
            if request.decision == gate_pb2.GATE_DECISION_APPROVE
            else gate_pb2.GATE_STATE_REJECTED
        )
        with self.lock:
            gate = self.gates.get(request.gate_id)
            if gate is None:
                raise NotFound(f"gate {request.gate_id} not found")
            if gate.state not in (gate_pb2.GATE_STATE_PENDING, state):
                raise FailedPrecondition(f"gate {gate.id} is resolved the other way already")
            gate.state = state
            gate.message = request.reason
            return gate_pb2.ResolveGateResponse(gate=gate)


def echo_servicers(
    clusters: int = 3,
    *,
    op_seconds: float = 0.3,
    capabilities: frozenset[int] = ALL_CAPABILITIES,
    state_path: str | None = None,
) -> PluginServicers:
    """A full echo plugin: clusters echo-000.., every service, the given capabilities.

    state_path journals its operations (the clusters themselves always start afresh).
    """
    fleet = EchoFleet.generate(clusters)
    return PluginServicers(
        identity=EchoIdentity(capabilities),
        cluster=EchoCluster(fleet, OperationStore("echo", state_path=state_path), op_seconds),
        health=EchoHealth(),
        gate=EchoGate(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serves the echo plugin until SIGTERM; prints the bound address as the first line."""
    parser = argparse.ArgumentParser(description=__doc__)
    add_server_args(parser)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--op-seconds", type=float, default=0.3)
    parser.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args(argv)
    configure_logging(args.debug)
    servicers = echo_servicers(args.clusters, op_seconds=args.op_seconds)
    server = serve(args.listen, servicers, tls=server_tls_from_args(args), plugin_name="echo")
    if isinstance(servicers.cluster, EchoCluster):
        server.add_stop_callback(servicers.cluster.store.close)
    print(server.address, flush=True)
    run_until_signal(server, grace=args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
