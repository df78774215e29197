"""The level-triggered reconciler: re-read a ClusterVersion and its fleet, plan, act, write."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from pydantic import ValidationError
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator import api
from orchestrator.analysis import Analyzer
from orchestrator.conditions import set_condition
from orchestrator.fleet import ClusterObs, OpKind, OpObs, OpState, PoolObs, Snapshot
from orchestrator.health import due_in, record
from orchestrator.kube import KubeClient, NotFound
from orchestrator.metrics import Metrics
from orchestrator.plan import (
    ACTIVE_PHASES,
    Action,
    Event,
    Plan,
    PlanInput,
    compact_entries,
    invalid,
    plan,
)
from orchestrator.validate import Problem, parse_spec, resolve_targets, validate_spec
from plugins.sdk.client import ClientTLS, PluginCallError, PluginClient

__all__ = [
    "OperationTracker",
    "PluginPool",
    "Reconciler",
    "cluster_from_pb",
    "op_from_pb",
]

log = logging.getLogger(__name__)

_KIND = {
    cluster_pb2.OPERATION_KIND_SERVICE_OUT: OpKind.SERVICE_OUT,
    cluster_pb2.OPERATION_KIND_SERVICE_IN: OpKind.SERVICE_IN,
    cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE: OpKind.CONTROL_PLANE,
    cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL: OpKind.NODE_POOL,
}
_STATE = {
    cluster_pb2.OPERATION_STATE_PENDING: OpState.PENDING,
    cluster_pb2.OPERATION_STATE_RUNNING: OpState.RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED: OpState.SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED: OpState.FAILED,
}
#: Errors after which a step will not succeed by asking again: the cluster is marked Failed.
_FATAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
#: How long to wait before asking again after FAILED_PRECONDITION (e.g. a maintenance window).
PRECONDITION_RETRY_SECONDS = 30.0
COMPONENT = "fleet-orchestrator"
#: Reads retried in place (beyond the channel's own UNAVAILABLE retries) before Degraded.
_READ_RETRY = Retrying(
    retry=retry_if_exception(lambda e: isinstance(e, PluginCallError) and e.retryable),
    wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
    stop=stop_after_attempt(3),
    reraise=True,
)


def op_from_pb(op: cluster_pb2.Operation) -> OpObs:
    """The planner's view of a contract Operation."""
    return OpObs(
        id=op.id,
        kind=_KIND[op.kind],
        cluster_id=op.cluster_id,
        state=_STATE.get(op.state, OpState.PENDING),
        request_id=op.request_id,
        node_pool=op.node_pool,
        target_version=op.target_version,
        error_code=op.error_code,
        error_message=op.error_message,
    )


def cluster_from_pb(c: cluster_pb2.Cluster) -> ClusterObs:
    """The planner's view of a contract Cluster."""
    return ClusterObs(
        id=c.id,
        control_plane_version=c.control_plane_version,
        node_pools=tuple(
            PoolObs(p.name, p.version, p.status != cluster_pb2.NODE_POOL_STATUS_ERROR)
            for p in c.node_pools
        ),
        labels=dict(c.labels),
        available=c.available,
        unavailable_reason=c.unavailable_reason,
        in_service=c.in_service,
        current_operation=op_from_pb(c.current_operation)
        if c.HasField("current_operation")
        else None,
    )


class PluginPool:
    """One long-lived client per plugin endpoint and TLS material."""

    def __init__(self, metrics: Metrics, caller: str) -> None:
        self._metrics = metrics
        self._caller = caller
        self._clients: dict[tuple[str, ClientTLS | None], PluginClient] = {}
        self._lock = threading.Lock()

    def get(self, endpoint: str, tls: ClientTLS | None) -> PluginClient:
        """The client for endpoint, created on first use."""
        key = (endpoint, tls)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                name = endpoint

                def record(rpc: str, code: grpc.StatusCode, seconds: float) -> None:
                    self._metrics.on_plugin_call(name, rpc, code.name, seconds)

                client = PluginClient(
                    endpoint, tls=tls, caller=self._caller, plugin_name=name, on_call=record
                )
                self._clients[key] = client
            return client

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


@dataclass
class _Stream:
    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)


class OperationTracker:
    """Follows every operation of each plugin through WatchOperations (no polling)."""

    #: Terminal operations kept for lookups; the oldest half is dropped past this many.
    MAX_OPERATIONS = 200_000

    def __init__(self, on_terminal: Callable[[str, OpObs], None]) -> None:
        self._ops: dict[str, OpObs] = {}
        self._by_request: dict[str, OpObs] = {}
        self._streams: dict[int, _Stream] = {}
        self._on_terminal = on_terminal
        self._lock = threading.Lock()

    def get(self, op_id: str) -> OpObs | None:
        """The latest state seen of an operation, by operation id."""
        with self._lock:
            return self._ops.get(op_id)

    def in_flight(self) -> list[OpObs]:
        """Operations last seen PENDING or RUNNING."""
        with self._lock:
            return [op for op in self._ops.values() if not op.state.terminal]

    def by_request(self) -> dict[str, OpObs]:
        """A copy of the latest operation states, keyed by request id."""
        with self._lock:
            return dict(self._by_request)

    def put(self, op: OpObs) -> bool:
        """Record a state; True when it is the first terminal state seen for the op."""
        with self._lock:
            old = self._ops.get(op.id)
            if old is not None and old.state.terminal:
                return False
            self._ops[op.id] = op
            if op.request_id:
                self._by_request[op.request_id] = op
            if len(self._ops) > self.MAX_OPERATIONS:
                for key in list(self._ops)[: self.MAX_OPERATIONS // 2]:
                    dropped = self._ops.pop(key)
                    self._by_request.pop(dropped.request_id, None)
            return op.state.terminal

    def follow(self, client: PluginClient) -> None:
        """Start the watch stream of a client, once."""
        with self._lock:
            if id(client) in self._streams:
                return
            stream = _Stream(
                threading.Thread(
                    target=self._run,
                    args=(client,),
                    name=f"watch-ops-{client.endpoint}",
                    daemon=True,
                )
            )
            self._streams[id(client)] = stream
        stream.thread.start()

    def stop(self) -> None:
        """Stop following."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.stop.set()

    def _run(self, client: PluginClient) -> None:
        stream = self._streams[id(client)]
        delay = 0.2
        while not stream.stop.is_set():
            watch = client.watch_operations(include_in_flight=True)
            try:
                for pb in watch:
                    delay = 0.2
                    op = op_from_pb(pb)
                    if self.put(op):
                        self._on_terminal(client.endpoint, op)
                    if stream.stop.is_set():
                        break
            except PluginCallError as err:
                log.info("operation watch on %s ended: %s; reconnecting", client.endpoint, err)
            finally:
                watch.cancel()
            stream.stop.wait(delay)
            delay = min(delay * 2, 10.0)


class _TLSError(Exception):
    pass


@dataclass
class Reconciler:
    """Reconciles one ClusterVersion at a time; safe to call again at any moment."""

    kube: KubeClient
    metrics: Metrics
    pool: PluginPool
    tracker: OperationTracker
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    emit_event: Callable[[dict[str, Any], Event], None] | None = None
    endpoints: dict[tuple[str, str], str] = field(default_factory=dict)
    uids: set[str] = field(default_factory=set)

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Bring one ClusterVersion a step closer to its spec; returns seconds to requeue after."""
        started = time.perf_counter()
        try:
            obj = self.kube.get_cluster_version(namespace, name)
        except NotFound:
            self.endpoints.pop((namespace, name), None)
            return None
        try:
            result = self._reconcile(obj)
            self.metrics.reconcile_total.labels("success").inc()
            return result
        except Exception:
            self.metrics.reconcile_total.labels("error").inc()
            raise
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    def _reconcile(self, obj: dict[str, Any]) -> float | None:
        meta = obj["metadata"]
        ns, name, gen = meta["namespace"], meta["name"], int(meta.get("generation", 1))
        now = self.clock()
        previous = _read_status(obj)
        parsed = parse_spec(obj.get("spec"))
        problems: list[Problem] = parsed if isinstance(parsed, list) else validate_spec(parsed)
        if isinstance(parsed, list) or problems:
            self.metrics.reconcile_total.labels("invalid").inc()
            self._write(obj, invalid(previous, problems, gen, now))
            return None
        spec = parsed
        self.endpoints[(ns, name)] = spec.ops_endpoint.endpoint
        self.uids.add(meta["uid"])
        try:
            ep = spec.ops_endpoint
            client = self.pool.get(ep.endpoint, self._tls(ns, ep.insecure, ep.tls))
        except _TLSError as err:
            return self._degraded(obj, previous, "TLSConfigError", str(err), gen, now, 30.0)
        self.tracker.follow(client)
        try:
            clusters = {c.id: cluster_from_pb(c) for c in _READ_RETRY.copy()(client.list_clusters)}
        except PluginCallError as err:
            return self._degraded(obj, previous, "PluginUnavailable", str(err), gen, now, 5.0)
        for op in self.tracker.in_flight():
            current = (
                clusters[op.cluster_id].current_operation if op.cluster_id in clusters else None
            )
            if op.cluster_id not in clusters or (current is not None and current.id == op.id):
                continue
            # The inventory no longer shows it in flight but no end was seen (a watch stream
            # that reconnected after it ended): ask once, as the contract says callers do.
            try:
                fresh = op_from_pb(client.get_operation(op.id))
            except PluginCallError:
                continue
            if self.tracker.put(fresh):
                self.count_operation(spec.ops_endpoint.endpoint, fresh)
        for entry in previous.entries().values():
            if entry.operation_id and self.tracker.get(entry.operation_id) is None:
                try:  # e.g. after a restart: learn the operation's state once
                    op = op_from_pb(client.get_operation(entry.operation_id))
                except PluginCallError as err:
                    if err.code != grpc.StatusCode.NOT_FOUND:
                        return self._degraded(
                            obj, previous, "PluginUnavailable", str(err), gen, now, 5.0
                        )
                    continue
                if self.tracker.put(op):
                    self.count_operation(spec.ops_endpoint.endpoint, op)
        ops = self.tracker.by_request()
        try:
            previous = self._analyse(obj, spec, previous, clusters, now)
        except _TLSError as err:
            return self._degraded(obj, previous, "TLSConfigError", str(err), gen, now, 30.0)
        annotations = meta.get("annotations") or {}
        result = plan(
            PlanInput(
                spec=spec,
                snapshot=Snapshot(clusters, ops),
                now=now,
                uid=meta["uid"],
                generation=gen,
                status=previous,
                approved_stages=_csv(annotations.get(api.ANNOTATION_APPROVE_STAGES)),
                retry_clusters=_csv(annotations.get(api.ANNOTATION_RETRY_CLUSTERS)),
            )
        )
        requeue = result.requeue_after
        if result.actions:
            resting = {cid for cid, e in previous.entries().items() if e.phase not in ACTIVE_PHASES}
            if any(
                a.cluster_id in resting or a.cluster_id not in previous.entries()
                for a in result.actions
            ):
                # A cluster leaves rest: record that it is ours before touching it, so a crash
                # right after the call resumes it rather than taking it for someone else's.
                self._write(obj, result)
            requeue = _min(requeue, self._execute(client, result))
        self._write(obj, result)
        for event in result.events:
            if self.emit_event is not None:
                self.emit_event(obj, event)
        self._gauges(ns, name, result.status)
        asked = _csv(annotations.get(api.ANNOTATION_RETRY_CLUSTERS))
        if asked:
            before, after = previous.entries(), result.status.entries()
            retried = {
                cid
                for cid in asked
                if cid in before
                and before[cid].phase == api.ClusterPhase.FAILED
                and (cid not in after or after[cid].phase != api.ClusterPhase.FAILED)
            }
            unknown = {
                cid
                for cid in asked
                if before.get(cid) is None or before[cid].phase != api.ClusterPhase.FAILED
            }
            left = sorted(asked - retried - unknown)  # consumed once: never retried twice
            if left != sorted(asked):
                self.kube.set_annotation(
                    ns, name, api.ANNOTATION_RETRY_CLUSTERS, ",".join(left) or None
                )
        return requeue

    def _analyse(
        self,
        obj: dict[str, Any],
        spec: api.ClusterVersionSpec,
        status: api.ClusterVersionStatus,
        clusters: dict[str, ClusterObs],
        now: datetime,
    ) -> api.ClusterVersionStatus:
        """Run the health checks that are due (clusters and stages in Verifying)."""
        if spec.health_checks is None and not any(
            st.health_checks for st in (spec.strategy.stages if spec.strategy else None) or []
        ):
            return status
        ns = obj["metadata"]["namespace"]

        def client_for(
            endpoint: str | None, insecure: bool | None, tls: api.TLSConfig | None
        ) -> PluginClient:
            ops = spec.ops_endpoint
            plaintext = ops.insecure if insecure is None else insecure
            return self.pool.get(
                endpoint or ops.endpoint,
                self._tls(
                    ns, plaintext, tls if endpoint else (tls or ops.tls), "spec.healthChecks"
                ),
            )

        def read(ref: api.SecretKeyRef) -> bytes:
            return self._secret_key(ns, ref, "spec.healthChecks")

        analyzer = Analyzer(client_for, read)
        stage_checks = {
            st.name: st.health_checks
            for st in (spec.strategy.stages if spec.strategy else None) or []
        }

        def checks_of(stage: str | None) -> api.HealthChecks | None:
            own = stage_checks.get(stage or "")
            return own if own is not None else spec.health_checks

        entries = status.entries()
        for cid, entry in entries.items():
            checks = checks_of(entry.stage)
            if (
                entry.phase != api.ClusterPhase.VERIFYING
                or entry.health is None
                or checks is None
                or cid not in clusters
                or due_in(entry.health, checks, now)
            ):
                continue
            results = analyzer.evaluate(checks, [clusters[cid]], entry.stage or "")
            entries[cid] = entry.model_copy(update={"health": record(entry.health, results, now)})
            self._report(obj, cid, results)
        stages = list(status.stages or [])
        targets = resolve_targets(spec, clusters)
        for i, st in enumerate(stages):
            checks = checks_of(st.name)
            if (
                st.phase != api.StagePhase.VERIFYING
                or st.health is None
                or checks is None
                or isinstance(targets, list)
                or due_in(st.health, checks, now)
            ):
                continue
            index = list(targets.stage_names).index(st.name)
            members = [clusters[c] for c in targets.stage_members[index] if c in clusters]
            results = analyzer.evaluate(checks, members, st.name)
            stages[i] = st.model_copy(update={"health": record(st.health, results, now)})
            self._report(obj, f"stage {st.name}", results)
        return status.model_copy(update={**compact_entries(entries), "stages": stages or None})

    def _report(self, obj: dict[str, Any], subject: str, results: list[api.CheckResult]) -> None:
        meta = obj["metadata"]
        for r in results:
            verdict = "passed" if r.passed else "failed"
            self.metrics.health_checks.labels(
                meta["namespace"], meta["name"], r.name, verdict
            ).inc()
            if r.value is not None:
                self.metrics.health_value.labels(meta["namespace"], meta["name"], r.name).set(
                    r.value
                )
            if self.emit_event is not None:
                reason = "HealthCheckPassed" if r.passed else "HealthCheckFailed"
                self.emit_event(obj, Event(subject, reason, f"{r.name}: {r.message}", not r.passed))

    def _execute(self, client: PluginClient, result: Plan) -> float | None:
        """Make the plan's calls; record operation ids (or why not) in the plan's status."""
        entries = result.status.entries()
        requeue: float | None = None
        for action in result.actions:
            entry = entries[action.cluster_id]
            try:
                op = op_from_pb(_call(client, action))
            except PluginCallError as err:
                if err.code in _FATAL_CODES:
                    entries[action.cluster_id] = entry.model_copy(
                        update={
                            "phase": api.ClusterPhase.FAILED,
                            "message": f"{action.step} refused: {err.code.name}: {err.message}",
                        }
                    )
                    continue
                wait = (
                    PRECONDITION_RETRY_SECONDS
                    if err.code == grpc.StatusCode.FAILED_PRECONDITION
                    else 2.0
                )
                entries[action.cluster_id] = entry.model_copy(
                    update={"message": f"waiting: {action.step}: {err.code.name}: {err.message}"}
                )
                requeue = _min(requeue, wait)
                continue
            if self.tracker.put(op):
                self.count_operation(client.endpoint, op)
            entries[action.cluster_id] = entry.model_copy(update={"operation_id": op.id})
            if op.state.terminal:
                requeue = 0.0
        result.status = result.status.model_copy(update=compact_entries(entries))
        return requeue

    def count_operation(self, plugin: str, op: OpObs) -> None:
        """Count a terminal operation of ours once (request ids start with a ClusterVersion uid)."""
        if op.request_id.split(":", 1)[0] not in self.uids:
            return
        counter = (
            self.metrics.success_operation
            if op.state == OpState.SUCCEEDED
            else self.metrics.failed_operation
        )
        counter.labels(op.kind.value, plugin).inc()

    def _tls(
        self,
        namespace: str,
        insecure: bool,
        tls: api.TLSConfig | None,
        field: str = "spec.opsEndpoint",
    ) -> ClientTLS | None:
        """TLS material for a plugin endpoint, read from the referenced Secrets."""
        if insecure:
            return None
        tls = tls or api.TLSConfig()
        ca = cert = key = None
        try:
            if tls.ca_secret_ref is not None:
                ca = self._secret_key(namespace, tls.ca_secret_ref, f"{field}.tls.caSecretRef")
            if tls.client_secret_name:
                data = self.kube.read_secret(namespace, tls.client_secret_name)
                if "tls.crt" not in data or "tls.key" not in data:
                    raise _TLSError(
                        f"{field}.tls.clientSecretName: Secret {tls.client_secret_name} "
                        "needs keys tls.crt and tls.key"
                    )
                cert, key = data["tls.crt"], data["tls.key"]
        except NotFound as err:
            raise _TLSError(f"{field}.tls: a referenced Secret is missing ({err})") from err
        return ClientTLS.from_pem(ca, cert, key, server_name=tls.server_name)

    def _secret_key(self, namespace: str, ref: api.SecretKeyRef, field: str) -> bytes:
        data = self.kube.read_secret(namespace, ref.name)
        if ref.key not in data:
            raise _TLSError(f"{field}: Secret {ref.name} has no key {ref.key}")
        return data[ref.key]

    def _degraded(
        self,
        obj: dict[str, Any],
        previous: api.ClusterVersionStatus,
        reason: str,
        message: str,
        gen: int,
        now: datetime,
        retry: float,
    ) -> float:
        conds = set_condition(
            list(previous.conditions or []), "Degraded", True, reason, message, gen, now
        )
        self._write(obj, Plan([], previous.model_copy(update={"conditions": conds})))
        return retry

    def _write(self, obj: dict[str, Any], result: Plan) -> None:
        body = result.status.dump()
        if body == (obj.get("status") or {}):
            return
        meta = obj["metadata"]
        updated = self.kube.replace_status(meta["namespace"], meta["name"], body)
        obj["status"] = updated.get("status", body)

    def _gauges(self, ns: str, name: str, status: api.ClusterVersionStatus) -> None:
        by_phase = status.summary.by_phase if status.summary and status.summary.by_phase else {}
        for phase in api.ClusterPhase:
            self.metrics.clusters.labels(ns, name, phase.value).set(by_phase.get(phase.value, 0))


def _call(client: PluginClient, action: Action) -> cluster_pb2.Operation:
    if action.kind is OpKind.SERVICE_OUT:
        return client.service_out(action.request_id, action.cluster_id)
    if action.kind is OpKind.SERVICE_IN:
        return client.service_in(action.request_id, action.cluster_id)
    if action.kind is OpKind.CONTROL_PLANE:
        return client.upgrade_control_plane(action.request_id, action.cluster_id, action.version)
    return client.upgrade_node_pool(
        action.request_id, action.cluster_id, action.node_pool, action.version
    )


def _read_status(obj: dict[str, Any]) -> api.ClusterVersionStatus:
    try:
        return api.ClusterVersionStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        log.warning(
            "status of %s/%s does not parse; starting from empty",
            obj["metadata"]["namespace"],
            obj["metadata"]["name"],
        )
        return api.ClusterVersionStatus()


def _csv(value: str | None) -> frozenset[str]:
    return frozenset(v.strip() for v in (value or "").split(",") if v.strip())


def _min(a: float | None, b: float | None) -> float | None:
    values: Iterable[float] = [v for v in (a, b) if v is not None]
    return min(values, default=None)
