"""README.md and docs/operations.md list the same metrics with the same labels, and those are
exactly what the orchestrator exports (orchestrator.adapters.metrics and the gate loop's)."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.adapters.metrics import Metrics
from orchestrator.controllers.approvals import _Metrics as GateMetrics

ROOT = Path(__file__).resolve().parents[2]


def documented(path: Path) -> dict[str, frozenset[str]]:
    """metric → labels, from the table of the document's "## Metrics" section."""
    text = path.read_text()
    section = text[text.index("\n## Metrics\n") :]
    section = section[: section.index("\n## ", 1)]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]
    header, body = rows[0], rows[1:]
    labels = header.index("labels")
    table = {
        row[0].strip("`"): frozenset(re.findall(r"\w+", row[labels]))
        for row in body
        if row[0].startswith("`multicluster_controller_")
    }
    assert len(table) == len(body), f"{path.name}: a row twice, or not a metric: {body}"
    return table


def exported() -> dict[str, frozenset[str]]:
    """metric (as scraped: counters with _total) → labels, from the orchestrator's collectors."""
    metrics = Metrics()
    collectors = [*vars(metrics).values(), *vars(GateMetrics(metrics)).values()]
    out: dict[str, frozenset[str]] = {}
    for collector in collectors:
        if not hasattr(collector, "describe"):
            continue
        # prometheus_client metrics keep their label names in _labelnames; RunClusters in LABELS.
        labels = getattr(collector, "_labelnames", None) or getattr(collector, "LABELS", ())
        for family in collector.describe():
            name = family.name + ("_total" if family.type == "counter" else "")
            out[name] = frozenset(labels)
    return out


def test_readme_and_operations_list_every_metric_with_its_labels() -> None:
    readme = documented(ROOT / "README.md")
    operations = documented(ROOT / "docs" / "operations.md")
    assert readme == operations
    assert readme == exported()
