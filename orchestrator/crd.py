"""Generation of the ClusterVersion CustomResourceDefinition from the typed models in api.py."""

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
        if key == "additionalProperties" and value is False:  # not allowed beside properties
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


def cluster_version_crd() -> dict[str, Any]:
    """The ClusterVersion CRD (apiextensions.k8s.io/v1) as a dict."""
    spec = structural_schema(api.ClusterVersionSpec)
    status = _without_defaults(structural_schema(api.ClusterVersionStatus))  # we write it whole
    _list_map(spec, ["clusters"], "id")
    _list_map(status, ["clusters"], "id")
    _list_map(status, ["stages"], "name")
    _list_map(status, ["conditions"], "type")
    spec["properties"]["strategy"]["properties"]["stages"]["maxItems"] = 64
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": "clusterversion",
                "shortNames": ["cv"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Up-To-Date",
                            "type": "integer",
                            "jsonPath": ".status.summary.upToDate",
                        },
                        {"name": "Total", "type": "integer", "jsonPath": ".status.summary.total"},
                        {"name": "Stage", "type": "string", "jsonPath": ".status.currentStage"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Desired versions for a fleet of clusters, "
                            "upgraded in stages without breaking the availability floor.",
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


def crd_yaml() -> str:
    """The CRD as the YAML checked in under manifests/crds/."""
    header = "# Generated by `python -m orchestrator.crd` from orchestrator/api.py. Do not edit.\n"
    return header + yaml.safe_dump(cluster_version_crd(), sort_keys=False)


if __name__ == "__main__":
    print(crd_yaml(), end="")
