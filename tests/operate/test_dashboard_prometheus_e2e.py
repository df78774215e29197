"""Issue 19: the shipped Grafana dashboard answers what a rollout did. A real Prometheus
(Debian's) scrapes the real `fleet-orchestrator run` and the sim plugin through a rollout; then
every query of the dashboard (each panel target, each variable) is evaluated through
Prometheus's HTTP API, with the variables substituted as Grafana does, and its answer checked."""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import api
from plugins.sim.server import SimOptions, Simulator
from tests.e2e.conftest import (
    NEW,
    Objects,
    Orchestrators,
    cluster_version,
    fleet_file,
    ids,
    metric_checks,
)
from tests.support.kube import wait_for
from tests.support.orchestrator import free_port
from tests.support.prometheus import (
    label_values,
    prometheus_binary,
    query,
    query_range,
    running_prometheus,
)

pytestmark = pytest.mark.skipif(
    prometheus_binary() is None and os.environ.get("CI") != "true",
    reason="prometheus is not installed (scripts/ensure-test-tools installs it)",
)

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "manifests/grafana/fleet-orchestrator-dashboard.json"
)
N = 7
MAX_CONCURRENCY = 2
QUERY = 'error_ratio{cluster="{{ cluster }}"}'
ERROR_RATIO = 0.004
PHASES = [p.value for p in api.UpgradePhase]
#: Grafana's $__rate_interval: here longer than the whole test, so each rate spans the rollout.
RATE_INTERVAL = "10m"

Result = list[dict[str, Any]]


def targets() -> list[tuple[int, str, str, str]]:
    """(panel id, panel title, refId, expr) of every panel target of the dashboard."""
    dash = json.loads(DASHBOARD.read_text())

    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    return [
        (p["id"], p["title"], t["refId"], t["expr"])
        for p in walk(dash["panels"])
        for t in p.get("targets", [])
    ]


def variable_queries() -> dict[str, tuple[str, str]]:
    """Each query variable of the dashboard: name → (series selector, label)."""
    dash = json.loads(DASHBOARD.read_text())
    out = {}
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            text = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", text.strip())
            assert match, f"variable {var['name']}: {text}"
            out[var["name"]] = (match.group(1), match.group(2))
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    """The expression as Grafana sends it: $__rate_interval and the dashboard's variables."""
    expr = re.sub(r"\$\{?__rate_interval\}?", RATE_INTERVAL, expr)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables[m.group(1)], expr)


def number(item: dict[str, Any]) -> float:
    return float(item["value"][1])


def by(result: Result, *labels: str) -> dict[tuple[str, ...], float]:
    """The answer keyed by the given labels' values (each key once)."""
    out: dict[tuple[str, ...], float] = {}
    for item in result:
        key = tuple(item["metric"].get(label, "") for label in labels)
        assert key not in out, f"two series for {key}: {result}"
        out[key] = number(item)
    return out


def scrape_counters(text: str, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """One sample family of a /metrics text, by label values."""
    return {
        tuple(s.labels[label] for label in labels): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def quantiles_ok(*results: Result, label: str | None = None) -> None:
    """histogram_quantile answers (p50, p95, ...): a number within the buckets (0, 10] or NaN
    (no observation in the window); in order where numbers; at least one number."""
    keyed = [by(r, *([label] if label else [])) for r in results]
    numbers = 0
    for key in keyed[0]:
        values = [k[key] for k in keyed if key in k]
        finite = [v for v in values if not math.isnan(v)]
        assert all(0 < v <= 10 for v in finite), (key, values)
        assert finite == sorted(finite), (key, values)
        numbers += len(finite)
    assert numbers, results


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[Simulator, CollectorRegistry, int]]:
    """The sim plugin in-process with its own registry served on a metrics port."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(fleet_file(N, step=0.3, metrics={QUERY.replace(" ", ""): ERROR_RATIO}))
    )
    registry = CollectorRegistry()
    sim = Simulator(
        SimOptions(
            fleet_file=str(fleet),
            monitor_file=str(tmp_path / "monitor.json"),
            target_version=NEW,
            seed=5,
            reload_interval=0,
            registry=registry,
        )
    )
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield sim, registry, port
    finally:
        server.shutdown()
        server.server_close()
        sim.stop()


def test_every_dashboard_query_answers_what_the_rollout_did(
    plugin: tuple[Simulator, CollectorRegistry, int],
    objects: Objects,
    orchestrators: Orchestrators,
    tmp_path: Path,
) -> None:
    sim, sim_registry, sim_port = plugin
    proc = orchestrators.start()
    jobs = [
        {
            "job_name": "orchestrator",
            "static_configs": [{"targets": [f"127.0.0.1:{proc.metrics_port}"]}],
        },
        {"job_name": "plugin", "static_configs": [{"targets": [f"127.0.0.1:{sim_port}"]}]},
    ]
    with running_prometheus(tmp_path, scrape_configs=jobs, interval="1s") as prom:
        wait_for("both targets are up", lambda: len(query(prom, "up == 1")) == 2, timeout=60)
        start = time.time()
        objects.create_cv(
            cluster_version(
                "fleet",
                sim.address,
                ids(N),
                N - MAX_CONCURRENCY,
                strategy={"maxConcurrency": MAX_CONCURRENCY},
                healthChecks=metric_checks(QUERY, 0.01, success=2),
            )
        )
        run = objects.current_run("fleet")
        ns = objects.ns
        wait_for("the rollout completes", lambda: objects.cv_phase_is("fleet", "Completed"), 120)
        assert dict(sim.monitor.snapshot())["clusters_at_target"] == N
        # Prometheus has scraped the end (scraped twice more, for the rates).
        wait_for(
            "Prometheus sees the end",
            lambda: (
                by(query(prom, 'sum(multicluster_controller_clusters{phase="Upgraded"})'))
                == {(): N}
            ),
            timeout=30,
            interval=0.5,
        )
        # The orchestrator's own counters just before and just after the instant evaluated:
        # what Prometheus answers at `end` lies between them (it scrapes every second).
        before = proc.metrics()
        time.sleep(2.5)
        end = time.time()
        text = proc.metrics()

        # The variables, as Grafana's label_values(match, label) asks for them (the namespace
        # chosen, the others "All", which Grafana sends as their allValue .*).
        variables = {"namespace": ns, "run": ".*", "plugin": ".*"}
        offered = {"namespace": {ns}, "run": {run}, "plugin": {sim.address}}
        for name, (match, label) in variable_queries().items():
            got = label_values(prom, label, substitute(match, variables))
            assert got == offered.pop(name), f"variable {name}: {match}, {label} offers {got}"
        assert not offered, f"variables no longer on the dashboard: {offered}"
        exprs = {(pid, ref): substitute(e, variables) for pid, _, ref, e in targets()}

        # Through the rollout (a point per second): the clusters by phase sum to N at every
        # instant; some were in flight, never more than maxConcurrency; progress only grows
        # and ends at 100 %.
        by_phase = query_range(prom, exprs[(6, "A")], start, end)
        assert {s["metric"]["phase"] for s in by_phase} == set(PHASES)
        sums: dict[float, float] = {}
        for s in by_phase:
            for t, v in s["values"]:
                sums[t] = sums.get(t, 0.0) + float(v)
        assert len(sums) >= 5 and set(sums.values()) == {N}, sums
        flight = [
            float(v) for s in query_range(prom, exprs[(3, "A")], start, end) for _, v in s["values"]
        ]
        assert 0 < max(flight) <= MAX_CONCURRENCY, flight
        progress = [
            float(v) for s in query_range(prom, exprs[(2, "A")], start, end) for _, v in s["values"]
        ]
        assert progress == sorted(progress) and progress[-1] == 1.0 and progress[0] < 1, progress

        # At the end, every panel target, each with the answer the rollout implies.
        failed = "multicluster_controller_failed_plugin_call_total"
        failed_before = set(scrape_counters(before, failed, "plugin", "rpc", "code"))
        failed_after = set(scrape_counters(text, failed, "plugin", "rpc", "code"))
        plugin_rpcs = scrape_counters(
            generate(sim_registry), "fleet_plugin_rpc_total", "plugin", "method", "code"
        )
        orchestrator_rpcs = scrape_counters(
            text, "multicluster_controller_plugin_call_duration_seconds_count", "rpc", "plugin"
        )
        answers = {key: query(prom, expr, end) for key, expr in exprs.items()}

        def each(key: tuple[int, str], check: Callable[[Result], object]) -> None:
            try:
                check(answers[key])
            except AssertionError as error:
                raise AssertionError(
                    f"panel {key}: {exprs[key]}\nanswered {answers[key]}"
                ) from error

        def equal(expected: dict[tuple[str, ...], float], *labels: str) -> Callable[[Result], None]:
            def check(result: Result) -> None:
                assert by(result, *labels) == expected

            return check

        def positive(keys: set[tuple[str, ...]], *labels: str) -> Callable[[Result], None]:
            def check(result: Result) -> None:
                got = by(result, *labels)
                assert set(got) == keys and all(v > 0 for v in got.values())

            return check

        def empty(result: Result) -> None:
            assert result == []

        operations = {(o,) for o in ("serviceOut", "controlPlane", "nodePool", "serviceIn")}
        expected: dict[tuple[int, str], Callable[[Result], object]] = {
            (2, "A"): equal({(): 1.0}),  # progress: 100 %
            (3, "A"): equal({(): 0.0}),  # in flight
            (4, "A"): equal({(): 0.0}),  # failed
            (5, "A"): equal({(): 0.0}),  # blocked
            (6, "A"): equal({(p,): float(N if p == "Upgraded" else 0) for p in PHASES}, "phase"),
            (7, "A"): equal(
                {(ns, run, p): float(N if p == "Upgraded" else 0) for p in PHASES},
                "namespace",
                "name",
                "phase",
            ),
            (9, "A"): positive(operations, "operation"),
            (9, "B"): empty,  # no operation failed
            # Plugin call errors: exactly the (plugin, rpc, code) the orchestrator counted.
            # Plugin call errors: the (plugin, rpc, code) the orchestrator counted.
            (10, "A"): that(
                lambda r: failed_before <= set(by(r, "plugin", "rpc", "code")) <= failed_after
            ),
            (11, "A"): lambda r: check_ratio(r, sim.address, failed_before, failed_after),
            # Latency by RPC: only RPCs the orchestrator made; numbers in the buckets, in order.
            (12, "A"): that(lambda r: rpcs_of(r) <= {k[0] for k in orchestrator_rpcs}),
            (12, "B"): that(lambda r: rpcs_of(r) <= {k[0] for k in orchestrator_rpcs}),
            (12, "C"): lambda r: quantiles_ok(
                answers[(12, "A")], answers[(12, "B")], r, label="rpc"
            ),
            # Served by the plugin: the label sets its own registry counted, service-outs > 0.
            (13, "A"): that(
                lambda r: (
                    set(by(r, "plugin", "method", "code")) <= set(plugin_rpcs)
                    and by(r, "plugin", "method", "code")[
                        ("sim", "ClusterService/ServiceOut", "OK")
                    ]
                    > 0
                )
            ),
            (14, "A"): lambda r: quantiles_ok(r, label="method"),
            (14, "B"): that(
                lambda r: set(by(r, "plugin")) == {("sim",)} and 0 < number(r[0]) <= 10
            ),
            # No legacy bridge and no KubeFleet collector in this stack: no data.
            (15, "A"): empty,
            (15, "B"): empty,
            (16, "A"): empty,
            (16, "B"): empty,
            # The last value each check saw: the sim's error ratio, for this run's check only.
            (18, "A"): equal({(ns, run, "error-ratio"): ERROR_RATIO}, "namespace", "name", "check"),
            (19, "A"): positive({("error-ratio", "passed")}, "check", "result"),
            (21, "A"): that(
                lambda r: (
                    set(by(r, "result")) <= {("success",), ("error",)}
                    and by(r, "result")[("success",)] > 0
                )
            ),
            (22, "A"): that(lambda r: len(r) == 1),
            (22, "B"): that(lambda r: len(r) == 1),
            (22, "C"): lambda r: quantiles_ok(answers[(22, "A")], answers[(22, "B")], r),
            (23, "A"): positive({()}),  # ClusterUpgrade status writes
            (24, "A"): empty,  # no notifications configured
            (25, "A"): equal({(): 0.0}),  # none waiting
        }
        unchecked, gone = set(exprs) - set(expected), set(expected) - set(exprs)
        assert not unchecked and not gone, f"every query is checked: {unchecked=} {gone=}"
        for key, check in expected.items():
            each(key, check)

        # A run deleted (its ClusterVersion first, else it is made again): its series go, and
        # the rollout panels answer nothing for it rather than a stale 100 %.
        objects.api.delete_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, "fleet")
        objects.api.delete_namespaced_custom_object(
            api.GROUP, api.VERSION, ns, api.UPDATE_RUN_PLURAL, run
        )
        wait_for(
            "the deleted run leaves the dashboard",
            lambda: query(prom, exprs[(6, "A")]) == [] and query(prom, exprs[(18, "A")]) == [],
            timeout=30,
            interval=0.5,
        )


def generate(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def that(predicate: Callable[[Result], bool]) -> Callable[[Result], None]:
    def check(result: Result) -> None:
        assert predicate(result)

    return check


def rpcs_of(result: Result) -> set[str]:
    return {item["metric"]["rpc"] for item in result}


def check_ratio(result: Result, address: str, before: set[Any], after: set[Any]) -> None:
    """The error ratio per plugin: 0 when no call failed (not "no data"), else in (0, 1)."""
    got = by(result, "plugin")
    assert set(got) == {(address,)}, got
    if before:
        assert 0 < got[(address,)] < 1, got
    elif not after:
        assert got[(address,)] == 0, got
    else:  # the first failure came while the end was being evaluated
        assert 0 <= got[(address,)] < 1, got
