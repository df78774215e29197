"""The upstream CRDs and cookbook examples the tests load, unmodified, for the 1.20 test server.

Where they come from (first that applies):

1. FLEET_UPGRADE_UPSTREAM_DIR: a directory holding them (the layout of ../shared/upstream:
   crds/, cookbook-examples/); every file is checked against its pin;
2. ../shared/upstream beside the project (its SOURCES.md says where each file is from);
3. otherwise they are downloaded once: each file pinned in upstream_pins.json by repository,
   commit and path, fetched from FLEET_UPGRADE_UPSTREAM_URL (default
   https://raw.githubusercontent.com) as <url>/<repo>/<commit>/<path>, checked against its
   sha256, and cached outside the work tree (~/.cache/fleet-upgrade/upstream, or under
   XDG_CACHE_HOME). When that fails (offline), the test run stops with one message saying what
   is missing and how to provide it; never a silent skip.

The files are never copied into this project. The local kube-apiserver is 1.20, which does not
know CEL (`x-kubernetes-validations`): `load_upstream_crds` strips those keys and `cel_rules`
hands them to the tests, which assert by hand the rules that apply to what a plugin writes.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.controlplane import REPO_ROOT

__all__ = [
    "DEFAULT_URL",
    "ENV_DIR",
    "ENV_URL",
    "PINS",
    "SHARED_UPSTREAM",
    "CelRule",
    "Pin",
    "UpstreamMissing",
    "cel_rules",
    "load_pins",
    "load_upstream_crds",
    "resolve_upstream",
    "schema_of",
    "upstream_dir",
    "upstream_file",
]

SHARED_UPSTREAM = (REPO_ROOT / ".." / "shared" / "upstream").resolve()
"""../shared/upstream relative to the project root (its SOURCES.md: where each file is from)."""

PINS = Path(__file__).with_name("upstream_pins.json")
ENV_DIR = "FLEET_UPGRADE_UPSTREAM_DIR"
ENV_URL = "FLEET_UPGRADE_UPSTREAM_URL"
DEFAULT_URL = "https://raw.githubusercontent.com"

_CEL = "x-kubernetes-validations"


@dataclass(frozen=True)
class Pin:
    """One upstream file: its name in the upstream directory, and where it is published."""

    name: str  # e.g. crds/ocm_managedclusters.yaml
    repo: str  # owner/name
    commit: str  # 40 hex digits
    path: str  # in the repository
    sha256: str

    def url(self, base: str) -> str:
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"


class UpstreamMissing(Exception):
    """The upstream files cannot be had; the message says which and how to provide them."""


def load_pins(path: Path = PINS) -> list[Pin]:
    """The pinned upstream files."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [Pin(**{k: str(v) for k, v in item.items()}) for item in data["files"]]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _problems(directory: Path, pins: list[Pin]) -> list[str]:
    """Each pinned file missing from directory or different from its pin."""
    out = []
    for pin in pins:
        path = directory / pin.name
        if not path.is_file():
            out.append(f"{pin.name}: missing")
        elif _sha256(path) != pin.sha256:
            out.append(f"{pin.name}: sha256 differs from its pin")
    return out


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleet-upgrade" / "upstream"


def _how_to_provide(pins: Path) -> str:
    return (
        f"provide them: set {ENV_DIR} to a directory holding them (the layout of "
        "../shared/upstream: crds/, cookbook-examples/), or "
        f"{ENV_URL} to a reachable mirror of {DEFAULT_URL}; each is pinned by repository, "
        f"commit, path and sha256 in {pins}"
    )


def _download(pin: Pin, base: str, target: Path, timeout: float) -> str:
    """Fetches one pinned file into target (atomically); "" or why it failed."""
    try:
        with urllib.request.urlopen(pin.url(base), timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} for {pin.url(base)}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"cannot reach {pin.url(base)} ({reason})"
    if hashlib.sha256(data).hexdigest() != pin.sha256:
        return f"{pin.url(base)} does not match its pinned sha256"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    partial.write_bytes(data)
    partial.replace(target)
    return ""


def resolve_upstream(
    *,
    directory: str | None = None,
    shared: Path = SHARED_UPSTREAM,
    base_url: str = DEFAULT_URL,
    cache: Path | None = None,
    pins_file: Path = PINS,
    timeout: float = 30.0,
) -> Path:
    """The directory holding every pinned upstream file (see the module docstring for the
    order); UpstreamMissing with one message naming what is missing and how to provide it."""
    pins = load_pins(pins_file)
    if directory:
        problems = _problems(Path(directory), pins)
        if problems:
            raise UpstreamMissing(
                f"upstream test files: {ENV_DIR}={directory} lacks {len(problems)} of "
                f"{len(pins)} ({'; '.join(problems[:3])}); {_how_to_provide(pins_file)}"
            )
        return Path(directory)
    if shared.is_dir():
        problems = _problems(shared, pins)
        if problems:
            raise UpstreamMissing(
                f"upstream test files: {shared} differs from the pins in {len(problems)} "
                f"file(s) ({'; '.join(problems[:3])}); update the pins or the directory"
            )
        return shared
    digest = hashlib.sha256(pins_file.read_bytes()).hexdigest()[:16]
    target = (cache or _cache_root()) / digest
    failures = []
    for pin in pins:
        path = target / pin.name
        if path.is_file() and _sha256(path) == pin.sha256:
            continue
        why = _download(pin, base_url, path, timeout)
        if why:
            failures.append(f"{pin.name}: {why}")
    if failures:
        raise UpstreamMissing(
            f"upstream test files: {len(failures)} of {len(pins)} could not be fetched and "
            f"{shared} does not exist (first: {failures[0]}); {_how_to_provide(pins_file)}"
        )
    return target


@functools.cache
def upstream_dir() -> Path:
    """The upstream directory for this test run; the run stops with one message when the files
    cannot be had (pytest.exit: never a skip, never one error per test)."""
    try:
        return resolve_upstream(
            directory=os.environ.get(ENV_DIR) or None,
            base_url=os.environ.get(ENV_URL) or DEFAULT_URL,
        )
    except UpstreamMissing as exc:
        pytest.exit(str(exc), returncode=3)


@dataclass(frozen=True)
class CelRule:
    """One x-kubernetes-validations rule: where it sits in the schema, its CEL and its message."""

    path: str  # e.g. "spec.upgrade"
    rule: str
    message: str


def upstream_file(name: str) -> Path:
    """An upstream file by its name (e.g. "cookbook-examples/main_example-crp.yaml")."""
    path = upstream_dir() / name
    if not path.is_file():
        raise FileNotFoundError(
            f"upstream file {name!r} is not among the pinned ones ({PINS}); pin it there"
        )
    return path


def _crd_files(pattern: str) -> list[Path]:
    files = sorted((upstream_dir() / "crds").glob(pattern))
    if not files:
        raise FileNotFoundError(f"no upstream CRD matches {pattern!r} in {upstream_dir() / 'crds'}")
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
