"""The gate loop: approve plugin gates (KubeFleet approval requests) once workloads are healthy.

For every configured plugin (`fleet-orchestrator run --plugin NAME=HOST:PORT`) that declares
PLUGIN_CAPABILITY_GATES, one thread follows WatchGates (re-listing with ListGates after any
stream error, as the contract asks) and evaluates each pending gate: when a gate arrives or
changes, and every resync period. A gate is approved with ResolveGate(APPROVE, reason) when every
tracked workload is HEALTHY on every cluster of the stage (the plugin's CheckWorkloads) and the
tracker's optional extra healthChecks pass (orchestrator.adapters.analysis.Analyzer,
successThreshold consecutive passes, as for a ClusterVersion stage). Otherwise the gate is held and
the reason is logged; an untracked gate, a stage without clusters or without tracked workloads is
always held.

The loop never rejects a gate. KubeFleet has no rejection: an approval request that is not
approved simply holds its run, which is the safe outcome, and stopping a run (spec.state Stop)
is a decision for people. Checks that exhaust failureThreshold or timeout are logged as failed
and the analysis starts over; the gate stays held.

Decisions are recorded as one log line per change of decision or reason, in the counter
multicluster_controller_gate_evaluation_total{plugin,result} and the gauge
multicluster_controller_gates_pending{plugin}; the approval reason is written by the plugin
on the provider's object.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import json_format
from prometheus_client import Counter, Gauge
from pydantic import ValidationError

from fleetupgrade.plugin.v1 import gate_pb2, identity_pb2
from orchestrator import api
from orchestrator.adapters.analysis import Analyzer
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.provider import PluginPool
from orchestrator.engine.health import check_problems, describe, due_in, judge, record
from orchestrator.engine.observations import ClusterObs
from plugins.sdk.client import ClientTLS, GateWatch, PluginCallError, PluginClient

__all__ = ["GateLoop", "PluginEndpoint", "parse_plugin_flag"]

log = logging.getLogger("fleet-orchestrator.gates")

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_ENDPOINT = re.compile(api.ENDPOINT_PATTERN)
_WORKLOADS_CHECK = "tracked-workloads"
_PENDING = gate_pb2.GATE_STATE_PENDING
_BACKOFF_MAX = 30.0

SecretReader = Callable[[api.SecretKeyRef], bytes]


@dataclass(frozen=True)
class PluginEndpoint:
    """A configured plugin: its name (for logs and metrics), HOST:PORT and TLS (None: plaintext)."""

    name: str
    endpoint: str
    tls: ClientTLS | None = None


def parse_plugin_flag(text: str) -> tuple[str, str]:
    """NAME=HOST:PORT → (name, endpoint); ValueError naming the fix."""
    name, sep, endpoint = text.partition("=")
    if not sep or not _NAME.match(name) or not _ENDPOINT.match(endpoint):
        raise ValueError(
            f"--plugin {text!r}: write NAME=HOST:PORT, e.g. kubefleet=127.0.0.1:50051 "
            "(NAME: lowercase letters, digits and dashes)"
        )
    return name, endpoint


@dataclass
class _GateState:
    """What the loop remembers about one pending gate."""

    gate: gate_pb2.Gate
    dirty: bool = True
    last_eval: float = 0.0
    health: api.HealthState | None = None
    checks_key: str = ""
    decision: str = ""
    reason: str = ""


@dataclass
class _Verdict:
    approve: bool
    reason: str
    results: list[api.CheckResult] = field(default_factory=list)


class _Metrics:
    def __init__(self, metrics: Metrics) -> None:
        self.evaluations = Counter(
            "multicluster_controller_gate_evaluation",
            "Gate evaluations by result (approve, hold, error).",
            ["plugin", "result"],
            registry=metrics.registry,
        )
        self.pending = Gauge(
            "multicluster_controller_gates_pending",
            "Pending gates the loop follows.",
            ["plugin"],
            registry=metrics.registry,
        )


class GateLoop:
    """One thread per configured plugin; stop with the stop event given."""

    def __init__(
        self,
        plugins: Sequence[PluginEndpoint],
        metrics: Metrics,
        stop: threading.Event,
        *,
        resync_seconds: float = 30.0,
        read_secret: SecretReader | None = None,
        caller: str = "fleet-orchestrator",
    ) -> None:
        self.plugins = list(plugins)
        self.stop = stop
        self.resync = max(0.1, resync_seconds)
        self.read_secret = read_secret
        self.pool = PluginPool(metrics, caller)
        self._metrics = _Metrics(metrics)
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Starts one thread per plugin (daemon threads; they end when stop is set)."""
        for plugin in self.plugins:
            thread = threading.Thread(
                target=self._run_plugin, args=(plugin,), name=f"gates-{plugin.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def join(self, timeout: float = 5.0) -> None:
        """Waits for the threads to end, then closes the plugin channels."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.pool.close()

    def _run_plugin(self, plugin: PluginEndpoint) -> None:
        try:
            _PluginGates(self, plugin).run()
        except Exception:
            log.exception("gate loop of plugin %s failed", plugin.name)


class _PluginGates:
    """The gates of one plugin: a watch thread keeping them current, and the evaluations."""

    def __init__(self, loop: GateLoop, plugin: PluginEndpoint) -> None:
        self.loop = loop
        self.plugin = plugin
        self.client: PluginClient = loop.pool.get(plugin.endpoint, plugin.tls)
        self.gates: dict[str, _GateState] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.watch: GateWatch | None = None

    # -- connection ---------------------------------------------------------------------------

    def run(self) -> None:
        if not self._has_gates():
            return
        watcher = threading.Thread(
            target=self._watch_loop, name=f"gates-watch-{self.plugin.name}", daemon=True
        )
        watcher.start()
        try:
            while not self.loop.stop.is_set():
                self.wake.wait(min(1.0, self.loop.resync))
                self.wake.clear()
                if self.loop.stop.is_set():
                    break
                self._evaluate_due()
        finally:
            watch = self.watch
            if watch is not None:
                watch.cancel()
            watcher.join(timeout=5)

    def _has_gates(self) -> bool:
        delay = 0.5
        while not self.loop.stop.is_set():
            try:
                caps = self.client.capabilities()
            except PluginCallError as err:
                log.warning("plugin %s: cannot read capabilities: %s", self.plugin.name, err)
                self.loop.stop.wait(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
                continue
            if identity_pb2.PLUGIN_CAPABILITY_GATES not in caps:
                log.info("plugin %s declares no gates: no gate loop for it", self.plugin.name)
                return False
            log.info(
                "following the gates of plugin %s at %s", self.plugin.name, self.plugin.endpoint
            )
            return True
        return False

    def _watch_loop(self) -> None:
        delay = 0.5
        while not self.loop.stop.is_set():
            try:
                listed = self.client.list_gates()
                with self.lock:
                    fresh = {g.id: g for g in listed if g.state == _PENDING}
                    for gate_id in set(self.gates) - set(fresh):
                        del self.gates[gate_id]
                    for gate in fresh.values():
                        self._upsert_locked(gate)
                self.wake.set()
                self.watch = self.client.watch_gates()
                if self.loop.stop.is_set():
                    self.watch.cancel()
                    return
                for event in self.watch:
                    delay = 0.5
                    with self.lock:
                        if (
                            event.type == gate_pb2.GATE_EVENT_TYPE_DELETED
                            or event.gate.state != _PENDING
                        ):
                            self.gates.pop(event.gate.id, None)
                        else:
                            self._upsert_locked(event.gate)
                    self.wake.set()
                if self.loop.stop.is_set():
                    return
            except PluginCallError as err:
                if self.loop.stop.is_set():
                    return
                level = logging.INFO if err.code == grpc.StatusCode.CANCELLED else logging.WARNING
                log.log(
                    level, "plugin %s: gate watch ended: %s; listing again", self.plugin.name, err
                )
            self.loop.stop.wait(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    def _upsert_locked(self, gate: gate_pb2.Gate) -> None:
        state = self.gates.get(gate.id)
        if state is None:
            self.gates[gate.id] = _GateState(gate)
        elif state.gate != gate:
            state.gate = gate
            state.dirty = True

    # -- evaluation ---------------------------------------------------------------------------

    def _evaluate_due(self) -> None:
        now = time.monotonic()
        with self.lock:
            states = list(self.gates.values())
        self.loop._metrics.pending.labels(self.plugin.name).set(len(states))
        for state in states:
            if self.loop.stop.is_set():
                return
            checks = self._checks_of(state.gate)
            if isinstance(checks, api.HealthChecks) and state.health is not None:
                # Extra checks keep their own cadence (consecutive passes make the soak).
                if due_in(state.health, checks, datetime.now(UTC)) > 0:
                    continue
            elif not state.dirty and now - state.last_eval < self.loop.resync:
                continue
            state.dirty = False
            state.last_eval = now
            self._evaluate(state, checks)

    def _checks_of(self, gate: gate_pb2.Gate) -> api.HealthChecks | str | None:
        """The tracker's extra healthChecks (validated), None when absent, or what is wrong."""
        if not gate.HasField("extra_health_checks"):
            return None
        raw = json_format.MessageToDict(gate.extra_health_checks)
        try:
            checks = api.HealthChecks.model_validate(_integers(raw))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return f"the tracker's healthChecks are invalid: {where}: {first['msg']}"
        problems = check_problems("healthChecks", checks)
        if problems:
            return "the tracker's healthChecks are invalid: " + "; ".join(
                f"{f}: {m}" for f, m in problems
            )
        return checks

    def _evaluate(self, state: _GateState, checks: api.HealthChecks | str | None) -> None:
        gate = state.gate
        try:
            verdict = self._verdict(state, checks)
        except Exception as err:  # a Secret missing, a plugin down: hold, say why, retry later
            self.loop._metrics.evaluations.labels(self.plugin.name, "error").inc()
            self._record(state, "hold", f"cannot evaluate: {type(err).__name__}: {err}")
            return
        if not verdict.approve:
            self.loop._metrics.evaluations.labels(self.plugin.name, "hold").inc()
            self._record(state, "hold", verdict.reason)
            return
        reason = f"fleet-orchestrator: {verdict.reason}"
        try:
            resolved = self.client.resolve_gate(gate.id, gate_pb2.GATE_DECISION_APPROVE, reason)
        except PluginCallError as err:
            self.loop._metrics.evaluations.labels(self.plugin.name, "error").inc()
            self._record(state, "hold", f"approval refused by the plugin: {err}")
            return
        self.loop._metrics.evaluations.labels(self.plugin.name, "approve").inc()
        self._record(state, "approve", verdict.reason)
        if resolved.state != _PENDING:
            with self.lock:
                self.gates.pop(gate.id, None)

    def _verdict(self, state: _GateState, checks: api.HealthChecks | str | None) -> _Verdict:
        gate = state.gate
        if not gate.tracked:
            return _Verdict(False, f"not tracked: {gate.message or 'no workload tracker'}")
        if not gate.cluster_ids:
            return _Verdict(False, f"the stage has no clusters: {gate.message}")
        if not gate.workloads:
            return _Verdict(False, f"no tracked workloads: {gate.message}")
        if isinstance(checks, str):
            return _Verdict(False, checks)
        workloads = api.HealthCheck(
            name=_WORKLOADS_CHECK,
            workloads=api.WorkloadsCheck(
                items=[
                    api.WorkloadRef(
                        namespace=w.namespace,
                        name=w.name,
                        kind=w.kind or None,
                        min_healthy_replicas=w.min_healthy_replicas or None,
                    )
                    for w in gate.workloads
                ]
            ),
        )
        if checks is None:
            block = api.HealthChecks(checks=[workloads], success_threshold=1)
        else:
            block = checks.model_copy(update={"checks": [workloads, *checks.checks]})
        clusters = self._clusters(gate, checks)
        results = Analyzer(self._client_for, self._read_secret).evaluate(
            block, clusters, gate.stage
        )
        if checks is None:
            passed = all(r.passed for r in results)
            return _Verdict(passed, describe(results), results)
        key = json_format.MessageToJson(gate.extra_health_checks, sort_keys=True)
        if key != state.checks_key:
            state.health, state.checks_key = None, key
        now = datetime.now(UTC)
        state.health = record(state.health, results, now)
        outcome = judge(state.health, checks, now)
        if outcome.passed:
            return _Verdict(True, f"{describe(results)} ({outcome.message})", results)
        if outcome.failed:
            log.warning(
                "gate %s: %s; holding it (the loop never rejects) and starting over",
                gate.id,
                outcome.message,
            )
            state.health = None
        return _Verdict(False, outcome.message, results)

    def _clusters(
        self, gate: gate_pb2.Gate, checks: api.HealthChecks | str | None
    ) -> list[ClusterObs]:
        wants_labels = isinstance(checks, api.HealthChecks) and any(
            c.metric is not None and "labels." in c.metric.query for c in checks.checks
        )
        if wants_labels and identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY in (
            self.client.capabilities()
        ):
            found = {c.id: c for c in self.client.list_clusters()}
            return [
                ClusterObs(id=c, control_plane_version="", labels=dict(found[c].labels))
                if c in found
                else ClusterObs(id=c, control_plane_version="")
                for c in gate.cluster_ids
            ]
        return [ClusterObs(id=c, control_plane_version="") for c in gate.cluster_ids]

    def _client_for(
        self, endpoint: str | None, insecure: bool | None, tls: api.TLSConfig | None
    ) -> PluginClient:
        if endpoint is None:
            return self.client
        if insecure or (insecure is None and tls is None):
            return self.loop.pool.get(endpoint, None)
        tls = tls or api.TLSConfig()
        ca = self._read_secret(tls.ca_secret_ref) if tls.ca_secret_ref else None
        cert = key = None
        if tls.client_secret_name:
            cert = self._read_secret(api.SecretKeyRef(name=tls.client_secret_name, key="tls.crt"))
            key = self._read_secret(api.SecretKeyRef(name=tls.client_secret_name, key="tls.key"))
        return self.loop.pool.get(
            endpoint, ClientTLS.from_pem(ca, cert, key, server_name=tls.server_name)
        )

    def _read_secret(self, ref: api.SecretKeyRef) -> bytes:
        if self.loop.read_secret is None:
            raise PluginCallError(
                "ReadSecret",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Secret {ref.name}: the gate loop has no access to Secrets",
            )
        return self.loop.read_secret(ref)

    def _record(self, state: _GateState, decision: str, reason: str) -> None:
        if (decision, reason) == (state.decision, state.reason):
            return
        state.decision, state.reason = decision, reason
        gate = state.gate
        what = "approved" if decision == "approve" else "held"
        log.info(
            "gate %s of plugin %s (run %s, stage %s) %s: %s",
            gate.id,
            self.plugin.name,
            gate.run,
            gate.stage,
            what,
            reason,
        )


def _integers(value: Any) -> Any:
    """Struct numbers are floats; make whole ones ints again (thresholds are integers)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integers(v) for v in value]
    return value
