"""The upstream CRDs of ../shared/upstream, loaded unmodified at test time for the 1.20 test server.

The files come from the upstream repositories listed in ../shared/upstream/SOURCES.md; they are
never copied into this project. The local kube-apiserver is 1.20, which does not know CEL
(`x-kubernetes-validations`): `load_upstream_crds` strips those keys and `cel_rules` hands them
to the tests, which assert by hand the rules that apply to what a plugin writes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools.controlplane import REPO_ROOT

__all__ = [
    "UPSTREAM",
    "UPSTREAM_CRDS",
    "CelRule",
    "cel_rules",
    "load_upstream_crds",
    "schema_of",
    "upstream_file",
]

UPSTREAM = (REPO_ROOT / ".." / "shared" / "upstream").resolve()
"""../shared/upstream relative to the project root (SOURCES.md says where each file is from)."""

UPSTREAM_CRDS = UPSTREAM / "crds"

_CEL = "x-kubernetes-validations"


@dataclass(frozen=True)
class CelRule:
    """One x-kubernetes-validations rule: where it sits in the schema, its CEL and its message."""

    path: str  # e.g. "spec.upgrade"
    rule: str
    message: str


def upstream_file(name: str) -> Path:
    """A file of ../shared/upstream by its relative name; FileNotFoundError says where it looked."""
    path = UPSTREAM / name
    if not path.is_file():
        raise FileNotFoundError(
            f"upstream file {name!r} not found at {path}; the tests load the upstream CRDs from "
            "../shared/upstream relative to the project root (see SOURCES.md there)"
        )
    return path


def _crd_files(pattern: str) -> list[Path]:
    files = sorted(UPSTREAM_CRDS.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no upstream CRD matches {pattern!r} in {UPSTREAM_CRDS}")
    return files


def _load(pattern: str) -> Iterator[dict[str, Any]]:
    for path in _crd_files(pattern):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                yield doc


def _strip(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {k: _strip(v) for k, v in node.items() if k != _CEL}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def load_upstream_crds(*patterns: str) -> list[dict[str, Any]]:
    """The CRDs of the files matching each glob (e.g. "ocm_*.yaml"), ready for a 1.20 server.

    Changes made, and only these: `x-kubernetes-validations` removed (CEL is unknown to 1.20;
    see cel_rules), and the `status` block of the file (what a server reported when the CRD
    was exported, not part of the definition) dropped.
    """
    crds = []
    for pattern in patterns:
        for doc in _load(pattern):
            crd = _strip(copy.deepcopy(doc))
            crd.pop("status", None)
            crd.setdefault("metadata", {}).pop("creationTimestamp", None)
            crds.append(crd)
    return crds


def cel_rules(pattern: str, version: str | None = None) -> list[CelRule]:
    """Every CEL rule of the matching CRDs (of one served version, or all), with its path."""
    found: list[CelRule] = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, Mapping):
            return
        for item in node.get(_CEL) or []:
            found.append(CelRule(path, str(item.get("rule", "")), str(item.get("message", ""))))
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}" if path else key)
        if isinstance(node.get("items"), Mapping):
            walk(node["items"], f"{path}[]")

    for doc in _load(pattern):
        for ver in doc["spec"]["versions"]:
            if version is None or ver["name"] == version:
                walk(ver["schema"]["openAPIV3Schema"], "")
    return found


def schema_of(pattern: str, version: str, path: str) -> dict[str, Any]:
    """The openAPIV3Schema node at a dotted path (e.g. "spec.upgrade") of one CRD version."""
    for doc in _load(pattern):
        for ver in doc["spec"]["versions"]:
            if ver["name"] != version:
                continue
            node: dict[str, Any] = ver["schema"]["openAPIV3Schema"]
            for part in path.split(".") if path else []:
                node = node["properties"][part]
            return node
    raise KeyError(f"{pattern} has no version {version} or no field {path}")
