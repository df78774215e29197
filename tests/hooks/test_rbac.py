"""Job hooks' RBAC: the install lets the orchestrator create and read Jobs in its own namespace
only (never list, watch, delete, never cluster-wide); the hook-jobs overlay adds one namespace."""

from __future__ import annotations

from typing import Any

from devtools.controlplane import REPO_ROOT
from tests.install.test_manifests import _grants
from tests.support.kubectl import kustomize, yaml_docs

SA = ("fleet-upgrade-system", "fleet-orchestrator")


def _jobs(path: str) -> set[tuple[str, ...]]:
    docs: list[dict[str, Any]] = yaml_docs(kustomize(REPO_ROOT / "manifests" / path))
    return {(ns, group, verb) for ns, group, res, verb in _grants(docs, SA) if res == "jobs"}


def test_the_install_creates_and_reads_jobs_only_in_its_namespace() -> None:
    assert _jobs("install") == {
        ("fleet-upgrade-system", "batch", "create"),
        ("fleet-upgrade-system", "batch", "get"),
    }


def test_the_hook_jobs_overlay_adds_exactly_one_namespace() -> None:
    assert _jobs("overlays/hook-jobs") == {
        (ns, "batch", verb)
        for ns in ("fleet-upgrade-system", "team-a")
        for verb in ("create", "get")
    }
    assert _jobs("overlays/inline-tls-secrets") == _jobs("install")
