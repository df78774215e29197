"""Generation of the CustomResourceDefinitions from the models of the kinds (orchestrator/api/)."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from orchestrator import api

__all__ = ["cluster_version_crd", "crd_yaml", "structural_schema"]

_DROP = {"title", "$defs", "discriminator"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema rewritten as a Kubernetes structural OpenAPI v3 schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _convert(raw, defs)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(node)
    extras = {k: v for k, v in node.items() if k.startswith("x-kubernetes-")}
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k not in _DROP}}
        return _convert(merged, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = sorted(o.get("type", "") for o in options)
        if types == ["integer", "string"]:
            out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
            if "description" in node:
                out["description"] = node["description"]
            return out
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k not in _DROP and k != "default"}
            if node.get("default") is not None:
                rest["default"] = node["default"]
            return _convert({**options[0], **rest}, defs)
        raise ValueError(f"cannot express anyOf {types} in a structural schema")
    out = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and isinstance(value, bool):
            # false is not allowed beside properties; true is said by preserve-unknown-fields
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = _convert(value, defs)
        elif key == "enum":
            out[key] = value
            out.setdefault("type", "string")
        else:
            out[key] = value
    if "properties" in out:
        out["type"] = "object"
    if "required" in out and not out["required"]:
        del out["required"]
    out.update(extras)
    return out


def _without_defaults(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k != "default"}
    if "properties" in out:
        out["properties"] = {k: _without_defaults(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _without_defaults(out[key])
    return out


def _list_map(schema: dict[str, Any], path: list[str], key: str) -> None:
    node = schema
    for part in path:
        node = node["properties"][part]
    node["x-kubernetes-list-type"] = "map"
    node["x-kubernetes-list-map-keys"] = [key]


def _crd(
    kind: str,
    plural: str,
    short: str,
    description: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    columns: list[dict[str, str]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        *columns,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def _col(name: str, kind: str, path: str, priority: int = 0) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


#: `-o wide`: the reason of the Degraded condition (PluginUnavailable, SecretError, ...;
#: AsExpected when nothing stops the run, ClusterFailed when clusters failed).
_DEGRADED = _col(
    "Degraded", "string", '.status.conditions[?(@.type=="Degraded")].reason', priority=1
)


def cluster_version_crd() -> dict[str, Any]:
    """The ClusterVersion CRD (apiextensions.k8s.io/v1) as a dict."""
    spec = structural_schema(api.ClusterVersionSpec)
    status = _without_defaults(structural_schema(api.ClusterVersionStatus))  # we write it whole
    _list_map(spec, ["clusters"], "id")
    _list_map(status, ["stages"], "name")
    _list_map(status, ["conditions"], "type")
    spec["properties"]["strategy"]["properties"]["stages"]["maxItems"] = 64
    return _crd(
        api.KIND,
        api.PLURAL,
        "cv",
        "Desired versions for a fleet of clusters, upgraded in stages without breaking the "
        "availability floor.",
        spec,
        status,
        [
            _col("Phase", "string", ".status.phase"),
            _col("Run", "string", ".status.currentRun"),
            _col("Up-To-Date", "integer", ".status.summary.upToDate"),
            _col("Total", "integer", ".status.summary.total"),
            _col("Failed", "integer", ".status.summary.failed"),
            _col("Stage", "string", ".status.currentStage"),
            _DEGRADED,
            _col("Message", "string", ".status.message", priority=1),
        ],
    )


def update_run_crd() -> dict[str, Any]:
    """The UpdateRun CRD: one rollout with its pinned cluster set."""
    spec = structural_schema(api.UpdateRunSpec)
    status = _without_defaults(structural_schema(api.UpdateRunStatus))
    _list_map(spec, ["clusters"], "id")
    _list_map(status, ["stages"], "name")
    _list_map(status, ["conditions"], "type")
    spec["properties"]["strategy"]["properties"]["stages"]["maxItems"] = 64
    return _crd(
        api.UPDATE_RUN_KIND,
        api.UPDATE_RUN_PLURAL,
        "ur",
        "One rollout: its cluster set and targets are pinned (as ClusterUpgrades) when it starts.",
        spec,
        status,
        [
            _col("State", "string", ".spec.state"),
            _col("Phase", "string", ".status.phase"),
            _col("Stage", "string", ".status.currentStage"),
            _col("Upgraded", "integer", ".status.counts.upgraded"),
            _col("In-Flight", "integer", ".status.counts.inFlight"),
            _col("Failed", "integer", ".status.counts.failed"),
            _col("Total", "integer", ".status.counts.total"),
            _col("Max-Failures", "integer", ".status.failures.maxFailures", priority=1),
            _col("Next-Start", "string", ".status.nextStartTime", priority=1),
            _DEGRADED,
            _col("Waiting", "string", ".status.waitingReason", priority=1),
            _col("Message", "string", ".status.message", priority=1),
        ],
    )


def cluster_upgrade_crd() -> dict[str, Any]:
    """The ClusterUpgrade CRD: one cluster's intent and progress in one run."""
    spec = structural_schema(api.ClusterUpgradeSpec)
    status = _without_defaults(structural_schema(api.ClusterUpgradeStatus))
    # A ClusterUpgrade is created without status (the status subresource drops it) and stays
    # so until its cluster starts: the apiserver defaults an absent status on every read, so
    # `kubectl get cu` shows PHASE Pending, as the model reads it, not an empty cell.
    status["default"] = {"phase": api.UpgradePhase.PENDING.value}
    _list_map(status, ["conditions"], "type")
    return _crd(
        api.CLUSTER_UPGRADE_KIND,
        api.CLUSTER_UPGRADE_PLURAL,
        "cu",
        "One cluster's upgrade in one UpdateRun: stage, targets, step, request and operation "
        "ids, attempt, health-check state and timestamps.",
        spec,
        status,
        [
            _col("Cluster", "string", ".spec.clusterId"),
            _col("Stage", "string", ".spec.stage"),
            _col("Target", "string", ".spec.version"),
            _col("Phase", "string", ".status.phase"),
            _col("Step", "string", ".status.step"),
            _col("Reason", "string", ".status.reason"),
            # The FleetProvider the cluster belongs to (several in a run over providerRefs).
            _col("Provider", "string", ".spec.providerName"),
            # status.attempt is 0 for the first attempt (request ids are made of it, so it
            # stays as stored); a column cannot add 1, so it is headed for what it counts.
            _col("Retries", "integer", ".status.attempt", priority=1),
            _col("Since", "date", ".status.lastTransitionTime", priority=1),
            _col("Message", "string", ".status.message", priority=1),
        ],
    )


def _cluster_scoped(crd: dict[str, Any]) -> dict[str, Any]:
    """A CRD of `_crd` made cluster-scoped, without status (the spec is all there is)."""
    crd["spec"]["scope"] = "Cluster"
    version = crd["spec"]["versions"][0]
    del version["subresources"]
    del version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return crd


def fleet_provider_crd() -> dict[str, Any]:
    """The FleetProvider CRD (cluster-scoped): a plugin endpoint, or one per capability, and
    who may use it."""
    return _cluster_scoped(
        _crd(
            api.FLEET_PROVIDER_KIND,
            api.FLEET_PROVIDER_PLURAL,
            "fp",
            "A provider plugin declared by a platform admin: its endpoint, its TLS (Secrets in the "
            "orchestrator's namespace), or one such FleetProvider per capability (spec.parts), "
            "and the namespaces whose ClusterVersions and UpdateRuns may name it in "
            "spec.providerRef.",
            structural_schema(api.FleetProviderSpec),
            {},
            [
                _col("Endpoint", "string", ".spec.endpoint"),
                _col("Insecure", "boolean", ".spec.insecure"),
                # A composed provider: where its clusters come from and who upgrades them.
                _col("Inventory", "string", ".spec.parts.inventory.name"),
                _col("Upgrades", "string", ".spec.parts.upgrades.name"),
            ],
        )
    )


def metric_source_crd() -> dict[str, Any]:
    """The MetricSource CRD (cluster-scoped): a Prometheus address and who may query it."""
    return _cluster_scoped(
        _crd(
            api.METRIC_SOURCE_KIND,
            api.METRIC_SOURCE_PLURAL,
            "ms",
            "A Prometheus declared by a platform admin: its address, token and CA (Secrets in the "
            "orchestrator's namespace) and the namespaces whose health checks may name it in "
            "metric.provider.sourceRef.",
            structural_schema(api.MetricSourceSpec),
            {},
            [_col("Address", "string", ".spec.address")],
        )
    )


def all_crds() -> list[dict[str, Any]]:
    """Every CRD of the project, in install order."""
    return [
        cluster_version_crd(),
        update_run_crd(),
        cluster_upgrade_crd(),
        fleet_provider_crd(),
        metric_source_crd(),
    ]


_HEADER = "# Generated by `python -m orchestrator.api.crd` from orchestrator/api/. Do not edit.\n"


def crd_files() -> dict[str, str]:
    """Each CRD's YAML as checked in under manifests/crds/, by file name."""
    return {
        f"{crd['metadata']['name']}.yaml": _HEADER + yaml.safe_dump(crd, sort_keys=False)
        for crd in all_crds()
    }


def crd_yaml() -> str:
    """Every CRD as one multi-document YAML stream (`fleet-orchestrator crd`)."""
    return "---\n".join(crd_files().values())


if __name__ == "__main__":
    import pathlib
    import sys

    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "manifests/crds")
    for file_name, text in crd_files().items():
        (out / file_name).write_text(text)
        print(out / file_name)
