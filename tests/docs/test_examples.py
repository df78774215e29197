"""The worked examples of README.md and docs/operations.md are valid objects: every ```yaml
block's ClusterVersion and UpdateRun parses with the API models and passes the admission
webhook's validation (orchestrator.adapters.webhook.admit), so the docs cannot drift from the
API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import api
from orchestrator.adapters.webhook import admit
from orchestrator.engine.validate import parse_model

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", ROOT / "docs" / "operations.md")
_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
_MODELS: dict[str, type[api.ClusterVersionSpec] | type[api.UpdateRunSpec]] = {
    api.KIND: api.ClusterVersionSpec,
    api.UPDATE_RUN_KIND: api.UpdateRunSpec,
}


def _examples() -> list[tuple[str, dict[str, Any]]]:
    """(where, object) for every ClusterVersion and UpdateRun in a yaml block of the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            for n, doc in enumerate(yaml.safe_load_all(match.group(1))):
                if isinstance(doc, dict) and doc.get("kind") in _MODELS:
                    where = f"{path.relative_to(ROOT)}:{line} ({doc['kind']} #{n + 1})"
                    found.append((where, doc))
    return found


EXAMPLES = _examples()


@pytest.mark.parametrize(("where", "doc"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_is_valid(where: str, doc: dict[str, Any]) -> None:
    assert doc.get("apiVersion") == api.API_VERSION, f"{where}: apiVersion"
    parsed = parse_model(_MODELS[doc["kind"]], doc.get("spec"))
    assert not isinstance(parsed, list), f"{where}: " + "; ".join(map(str, parsed))
    # The admission webhook's judgement of a CREATE (without the namespace's access rules,
    # which depend on the FleetProviders a cluster has).
    request = {
        "operation": "CREATE",
        "kind": {"group": api.GROUP, "version": api.VERSION, "kind": doc["kind"]},
        "namespace": (doc.get("metadata") or {}).get("namespace", "team-a"),
        "object": doc,
    }
    problems = admit(request)
    assert problems == [], f"{where}: " + "; ".join(map(str, problems))


def _paths(node: Any, prefix: str = "") -> set[str]:
    """Every key path of a nested object, list indices dropped: spec.strategy.stages.name."""
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.add(path)
            out |= _paths(value, path)
    elif isinstance(node, list):
        for item in node:
            out |= _paths(item, prefix)
    return out


def _values(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set().union(*(_values(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(_values(v) for v in node)) if node else set()
    return {str(node)}


def test_every_operating_feature_has_a_worked_example() -> None:
    """Issue 12's features each appear in at least one validated example."""
    paths: set[str] = set()
    values: set[str] = set()
    kinds: set[str] = set()
    for _, doc in EXAMPLES:
        paths |= _paths(doc)
        values |= _values(doc)
        kinds.add(doc["kind"])
    assert kinds == {api.KIND, api.UPDATE_RUN_KIND}
    wanted = {
        "spec.strategy.maxFailures",
        "spec.strategy.stages.maxFailures",
        "spec.strategy.failedClusterPolicy",
        "spec.skip.clusters",
        "spec.skip.stages",
        "spec.skip.reason",
        "spec.skip.requestedBy",
        "spec.retry.clusters",
        "spec.retry.round",
        "spec.state",
        "spec.strategy.maintenance.windows.days",
        "spec.strategy.maintenance.windows.rrule",
        "spec.strategy.maintenance.windows.timeZone",
        "spec.strategy.maintenance.exclusions.start",
        "spec.strategy.maintenance.providerWindows",
        "spec.strategy.maintenance.expectedDuration",
        "spec.strategy.maintenance.allowOverrun",
        "spec.strategy.stages.maintenance.windows",
        "spec.strategy.notBefore",
        "spec.strategy.hooks.preUpgrade.http.urlSecretRef",
        "spec.strategy.hooks.postUpgrade.job.template",
        "spec.notifications.urlSecretRef",
        "spec.notifications.bearerTokenSecretRef",
        "spec.notifications.events",
    }
    assert wanted <= paths, f"no worked example sets {sorted(wanted - paths)}"
    assert {"CloudEvents", "Slack", "ServiceInIfHealthy", "WindowsAndExclusions"} <= values
