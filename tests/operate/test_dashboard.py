"""The Grafana dashboard: its PromQL parses and names only metrics the project exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from orchestrator import api
from orchestrator.adapters.metrics import Metrics
from orchestrator.engine.decide import ACTIVE
from plugins.kubefleet.collector import CollectorOptions, MetricCollectorAgent
from plugins.legacy.upstream import UpstreamMetrics
from plugins.sdk.interceptors import rpc_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "manifests" / "grafana" / "fleet-orchestrator-dashboard.json"

#: Grafana's interval variables stand for a duration; the dashboard's own variables for a value.
_INTERVALS = re.compile(
    r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}"
)
_VARIABLES = re.compile(r"\$\{?(\w+)\}?")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")

#: Series each metric type exports (prometheus_client: counters `_total` and `_created`...).
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}


def _series_names(registry: CollectorRegistry) -> set[str]:
    metric: Metric
    names: set[str] = set()
    for metric in registry.collect():
        names.update(metric.name + s for s in _SUFFIXES.get(metric.type, ("",)))
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every series name the orchestrator and the plugins export, read from their registries."""
    orchestrator = Metrics()
    plugins = CollectorRegistry()
    rpc_metrics(plugins)
    UpstreamMetrics.of(plugins)
    # The KubeFleet collector's counters are made in its constructor; it never connects here.
    kubeconfig = tmp_path_factory.mktemp("kube") / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "unused"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    agent = MetricCollectorAgent(
        CollectorOptions(
            cluster_name="member-1",
            member_kubeconfig=str(kubeconfig),
            hub_kubeconfig=str(kubeconfig),
            registry=plugins,
        )
    )
    agent.member.close()
    agent.hub.close()
    names = _series_names(orchestrator.registry) | _series_names(plugins)
    # Labelled metrics without children export nothing yet: add their names from the objects.
    for collector in vars(orchestrator).values():
        describe = getattr(collector, "describe", None)
        if describe is not None:
            for metric in describe():
                names.update(metric.name + s for s in _SUFFIXES.get(metric.type, ("",)))
    return names


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    dash = _dashboard()
    out = [
        (f"panel {p['title']!r} target {t['refId']}", t["expr"])
        for p in _panels(dash["panels"])
        for t in p.get("targets", [])
    ]
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = _LABEL_VALUES.match(query.strip())
        assert match, f"variable {var['name']}: only label_values(...) queries are used: {query}"
        if match.group(1):
            out.append((f"variable {var['name']}", match.group(1)))
    return out


def _concrete(expr: str) -> str:
    """The expression as Prometheus receives it once Grafana substituted its variables."""
    return _VARIABLES.sub("x", _INTERVALS.sub("5m", expr))


def _metric_names(node: Any) -> Iterator[str]:
    """Metric names of every vector selector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        return
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector", "args"):
        child = getattr(node, attribute, None)
        if child is None:
            continue
        for item in child if isinstance(child, list) else [child]:
            yield from _metric_names(item)


def test_dashboard_is_grafana_json() -> None:
    dash = _dashboard()
    assert dash["uid"] == "fleet-orchestrator"
    panels = [p for p in _panels(dash["panels"]) if p["type"] != "row"]
    ids = [p["id"] for p in _panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    assert all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "namespace", "run"}


def test_every_expression_parses_and_names_exported_metrics(exported: set[str]) -> None:
    expressions = _expressions()
    assert len(expressions) >= 20
    used: set[str] = set()
    for where, expr in expressions:
        try:
            tree = promql_parser.parse(_concrete(expr))
        except ValueError as error:
            pytest.fail(f"{where}: does not parse: {error}\n{expr}")
        names = set(_metric_names(tree))
        assert names, f"{where}: names no metric: {expr}"
        unknown = names - exported
        assert not unknown, f"{where}: {sorted(unknown)} are not exported by the project"
        used |= names
    # The areas the dashboard covers (issue 12 item 6).
    for name in (
        "multicluster_controller_clusters",
        "multicluster_controller_failed_plugin_call_total",
        "multicluster_controller_plugin_call_duration_seconds_bucket",
        "multicluster_controller_health_check_value",
        "multicluster_controller_reconcile_total",
        "multicluster_controller_reconcile_duration_seconds_bucket",
        "multicluster_controller_api_writes_total",
        "fleet_plugin_rpc_duration_seconds_bucket",
    ):
        assert name in used, f"the dashboard shows {name}"


def test_metric_name_walker_sees_through_functions_and_operators() -> None:
    tree = promql_parser.parse(
        "histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m])))"
        " / on() (b + -max_over_time(c[5m:1m]))"
    )
    assert set(_metric_names(tree)) == {"a_bucket", "b", "c"}


def test_unexported_name_is_caught(exported: set[str]) -> None:
    assert "multicluster_controller_clusters" in exported
    assert "multicluster_controller_reconcile_total" in exported
    assert "multicluster_controller_reconcile_duration_seconds_count" in exported
    assert "multicluster_controller_reconcile" not in exported  # counters export _total


def _phases(expr: str) -> set[str]:
    """The phases a `phase=~"A|B"` or `phase="A"` matcher of an expression selects."""
    match = re.search(r'phase=~?"([^"]*)"', expr)
    assert match, expr
    return set(match.group(1).split("|"))


def test_rollout_panels_select_the_phases_the_engine_defines() -> None:
    """In flight is every phase a run holds a cluster in (engine.ACTIVE, hooks included);
    each phase a panel names exists."""
    by_title = {
        p["title"]: p["targets"][0]["expr"]
        for p in _panels(_dashboard()["panels"])
        if p["type"] != "row"
    }
    phases = {p.value for p in api.UpgradePhase}
    assert _phases(by_title["Clusters in flight"]) == {p.value for p in ACTIVE}
    assert _phases(by_title["Rollout progress"]) == {"Upgraded", "Skipped"}
    assert _phases(by_title["Failed clusters"]) == {"Failed"}
    assert _phases(by_title["Blocked clusters"]) == {"Blocked"}
    for title, expr in by_title.items():
        if "phase=" in expr:
            assert _phases(expr) <= phases, title
