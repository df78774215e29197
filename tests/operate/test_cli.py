"""fleet-orchestrator's operator verbs against the real local apiserver: the objects they change
and the status they render (ClusterVersion, UpdateRun and ClusterUpgrades written directly, their
statuses through the status subresource, as the controllers would leave them)."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator import api, operate
from orchestrator.adapters.kube import KubeClient
from orchestrator.cli import main
from orchestrator.operate import (
    ClusterLine,
    Snapshot,
    StageLine,
    render,
    renderable,
    snapshot,
    verbs,
)
from orchestrator.operate.read import cause, resolve
from tests.support.kube import KubeCluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The moment the docs' worked example is rendered at.
NOW = datetime(2026, 11, 23, 1, 14, 30, tzinfo=UTC)
STAGES = [
    {"name": "canary", "clusters": ["c1"]},
    {"name": "wave-1", "clusters": ["c2", "c3", "c4"], "approval": "Manual"},
]
CLUSTERS = [{"id": f"c{i}", "version": "1.29.1"} for i in range(1, 5)]
#: What the controllers would have recorded: cluster -> (stage, stage index, status).
UPGRADES: dict[str, tuple[str, int, dict[str, Any]]] = {
    "c1": ("canary", 0, {"phase": "Upgraded", "attempt": 0}),
    "c2": (
        "wave-1",
        1,
        {
            "phase": "UpgradingNodePools",
            "step": "nodePool/a",
            "attempt": 0,
            "stepStartTime": "2026-11-23T01:10:00Z",
        },
    ),
    "c3": (
        "wave-1",
        1,
        {
            "phase": "Failed",
            "attempt": 0,
            "reason": "StepTimedOut",
            "message": "controlPlane took longer than 90m",
            "lastTransitionTime": "2026-11-23T01:12:00Z",
        },
    ),
    "c4": (
        "wave-1",
        1,
        {"phase": "Blocked", "reason": "ClaimHeld", "message": "claimed by team-b/other"},
    ),
}


class Objects:
    """A ClusterVersion "prod" with its current run "prod-1" and four ClusterUpgrades."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace

    def create(self) -> None:
        endpoint = {"endpoint": "127.0.0.1:1", "insecure": True}
        spec = {"opsEndpoint": endpoint, "clusters": CLUSTERS, "strategy": {"stages": STAGES}}
        cv = self.kube.create_object(
            api.PLURAL,
            self.ns,
            {
                "apiVersion": api.API_VERSION,
                "kind": "ClusterVersion",
                "metadata": {"name": "prod", "annotations": {api.ANNOTATION_RETRY_CLUSTERS: "c9"}},
                "spec": spec,
            },
        )
        run = self.kube.create_object(
            api.UPDATE_RUN_PLURAL,
            self.ns,
            {
                "apiVersion": api.API_VERSION,
                "kind": api.UPDATE_RUN_KIND,
                "metadata": {"name": "prod-1", "labels": {api.LABEL_CLUSTER_VERSION: "prod"}},
                "spec": {
                    "state": "Run",
                    "clusterVersionRef": {"name": "prod", "generation": 1},
                    "opsEndpoint": endpoint,
                    "strategy": {"stages": STAGES},
                },
            },
        )
        stages = [
            {"name": "canary", "phase": "Completed", "total": 1, "upgraded": 1, "maxFailures": 0},
            {
                "name": "wave-1",
                "phase": "Progressing",
                "total": 3,
                "upgraded": 0,
                "failed": 1,
                "maxFailures": 1,
            },
        ]
        self.write_status(
            api.UPDATE_RUN_PLURAL,
            run,
            {
                "phase": "Progressing",
                "currentStage": "wave-1",
                "counts": {"total": 4, "upgraded": 1, "inFlight": 1, "failed": 1, "blocked": 1},
                "stages": stages,
                "failures": {"count": 1, "maxFailures": 1, "clusters": ["c3"]},
                "nextStartTime": "2026-11-23T04:00:00Z",
                "waitingReason": "c4: its maintenance window is closed",
                "startTime": "2026-11-23T01:00:00Z",
            },
        )
        self.write_status(
            api.PLURAL,
            cv,
            {
                "phase": "Progressing",
                "message": "stage wave-1: 1 cluster in flight",
                "currentRun": "prod-1",
                "currentStage": "wave-1",
                "summary": {"total": 4, "upToDate": 1, "inFlight": 1, "failed": 1},
                "stages": stages,
                "runs": [
                    {"name": "prod-1", "phase": "Progressing", "startTime": "2026-11-23T01:00:00Z"}
                ],
            },
        )
        for cluster, (stage, index, status) in UPGRADES.items():
            cu = self.kube.create_object(
                api.CLUSTER_UPGRADE_PLURAL,
                self.ns,
                {
                    "apiVersion": api.API_VERSION,
                    "kind": api.CLUSTER_UPGRADE_KIND,
                    "metadata": {"name": f"prod-1-{cluster}", "labels": {api.LABEL_RUN: "prod-1"}},
                    "spec": {
                        "clusterId": cluster,
                        "stage": stage,
                        "stageIndex": index,
                        "version": "1.29.1",
                        "nodeVersion": "1.29.1",
                        "provider": "127.0.0.1:1",
                    },
                },
            )
            self.write_status(api.CLUSTER_UPGRADE_PLURAL, cu, status)

    def write_status(self, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.kube.write_status(plural, self.ns, meta["name"], status, meta["resourceVersion"])

    def standalone(self) -> None:
        """An UpdateRun "solo" applied directly (no ClusterVersion), not started yet."""
        self.kube.create_object(
            api.UPDATE_RUN_PLURAL,
            self.ns,
            {
                "apiVersion": api.API_VERSION,
                "kind": api.UPDATE_RUN_KIND,
                "metadata": {"name": "solo"},
                "spec": {
                    "opsEndpoint": {"endpoint": "127.0.0.1:1", "insecure": True},
                    "clusters": CLUSTERS,
                    "strategy": {"stages": STAGES},
                },
            },
        )

    def timeless(self) -> None:
        """Drop the times the view counts from now (c2's step start, the run's next start), so
        a render changes only when the objects do."""
        for plural, name, key in (
            (api.CLUSTER_UPGRADE_PLURAL, "prod-1-c2", "stepStartTime"),
            (api.UPDATE_RUN_PLURAL, "prod-1", "nextStartTime"),
        ):
            obj = self.kube.get_object(plural, self.ns, name)
            self.write_status(plural, obj, {k: v for k, v in obj["status"].items() if k != key})

    def annotations(self, plural: str, name: str) -> dict[str, str]:
        obj = self.kube.get_object(plural, self.ns, name)
        return dict(obj["metadata"].get("annotations") or {})

    def state(self, run: str) -> str:
        return str(self.kube.get_object(api.UPDATE_RUN_PLURAL, self.ns, run)["spec"]["state"])


@pytest.fixture
def objects(control_plane: KubeCluster, namespace: str) -> Iterator[Objects]:
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        made = Objects(kube, namespace)
        made.create()
        yield made
    finally:
        kube.close()


def cli(
    control_plane: KubeCluster, namespace: str, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = main(
        [args[0], "--kubeconfig", str(control_plane.kubeconfig), "-n", namespace, *args[1:]]
    )
    out, err = capsys.readouterr()
    return code, out, err


def test_status_of_a_cluster_version(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(control_plane, objects.ns, "status", "prod", capsys=capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"ClusterVersion {objects.ns}/prod: Progressing\n")
    assert "Current run: prod-1 (Progressing)" in out
    assert "Clusters: 4 total, 1 upgraded, 1 in flight, 0 pending, 1 failed, 1 blocked" in out
    assert "Failure budget: 1 failed of 1 allowed: c3" in out
    assert "Waiting: c4: its maintenance window is closed; next start 2026-11-23T04:00:00Z" in out
    assert "wave-1  Progressing  ✗✗✗✗✗✗✗░░░░░░░░░░░░░  0/3       0        1       1" in out
    assert "c3 (stage wave-1, attempt 1): StepTimedOut: controlPlane took longer than 90m" in out
    # Attempts are 1-based for people (status.attempt is 0 for the first), as Events say.
    assert "c4 (stage wave-1, attempt 1): ClaimHeld: claimed by team-b/other" in out
    assert "retry: fleet-orchestrator retry prod c3" in out
    # Ages are measured from now; at a fixed now the view is the docs' worked example verbatim
    # (docs/operations.md, "Operating from the CLI").
    snap = replace(snapshot(objects.kube, objects.ns, "prod"), now=NOW)
    assert "c2       wave-1  UpgradingNodePools  nodePool/a  4m" in render(snap)
    docs = (ROOT / "docs" / "operations.md").read_text()
    example = docs.split("$ fleet-orchestrator status prod -n team-a\n", 1)[1].split("\n$ ", 1)[0]
    assert render(snap) == example.replace("team-a", objects.ns) + "\n"


def test_status_of_a_run_and_of_the_namespace(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(control_plane, objects.ns, "status", "prod-1", capsys=capsys)
    assert code == 0
    assert out.startswith(f"UpdateRun {objects.ns}/prod-1: Progressing\n")
    assert "Current run" not in out
    assert "c3 (stage wave-1, attempt 1)" in out
    # Without NAME: every ClusterVersion (its runs are shown through it).
    code, out, _ = cli(control_plane, objects.ns, "status", capsys=capsys)
    assert code == 0
    assert out.count("ClusterVersion ") == 1 and "UpdateRun " not in out


def test_a_cluster_in_its_hook_is_in_flight(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    objects.standalone()
    cu = objects.kube.create_object(
        api.CLUSTER_UPGRADE_PLURAL,
        objects.ns,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.CLUSTER_UPGRADE_KIND,
            "metadata": {"name": "solo-c1", "labels": {api.LABEL_RUN: "solo"}},
            "spec": {
                "clusterId": "c1",
                "stage": "canary",
                "stageIndex": 0,
                "version": "1.29.1",
                "nodeVersion": "1.29.1",
                "provider": "127.0.0.1:1",
            },
        },
    )
    hook = {"kind": "preUpgrade", "id": "solo-c1-pre-1", "startTime": "2026-11-23T01:13:00Z"}
    objects.write_status(
        api.CLUSTER_UPGRADE_PLURAL,
        cu,
        {"phase": "PreUpgradeHook", "attempt": 1, "hook": hook},
    )
    code, out, _ = cli(control_plane, objects.ns, "status", "solo", capsys=capsys)
    assert code == 0
    assert "In flight (1):" in out
    assert "  c1       canary  PreUpgradeHook  preUpgrade Running" in out
    # The hook's age, from its start.
    snap = replace(snapshot(objects.kube, objects.ns, "solo"), now=NOW)
    assert "  c1       canary  PreUpgradeHook  preUpgrade Running  1m" in render(snap)
    # Stages skipped in the spec (GitOps) are shown like those of the annotation.
    objects.kube.merge_patch(
        api.UPDATE_RUN_PLURAL, objects.ns, "solo", {"spec": {"skip": {"stages": ["wave-1"]}}}
    )
    assert (
        "Skipped stages: wave-1"
        in cli(control_plane, objects.ns, "status", "solo", capsys=capsys)[1]
    )


def test_status_and_kubectl_show_each_clusters_provider(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run over several FleetProviders (spec.providerRefs): `status` says each cluster's
    provider (in flight, failed) and counts per provider; `kubectl get cu` has PROVIDER."""
    objects.standalone()
    clusters = {
        "g1": ("gke-prod", {"phase": "UpgradingControlPlane", "step": "controlPlane"}),
        "e1": ("eks-prod", {"phase": "Failed", "reason": "OperationFailed", "message": "boom"}),
        "e2": ("eks-prod", {"phase": "Upgraded"}),
    }
    for cid, (provider, status) in clusters.items():
        cu = objects.kube.create_object(
            api.CLUSTER_UPGRADE_PLURAL,
            objects.ns,
            {
                "apiVersion": api.API_VERSION,
                "kind": api.CLUSTER_UPGRADE_KIND,
                "metadata": {"name": f"solo-{cid}", "labels": {api.LABEL_RUN: "solo"}},
                "spec": {
                    "clusterId": cid,
                    "stage": "canary",
                    "stageIndex": 0,
                    "version": "1.29.1",
                    "nodeVersion": "1.29.1",
                    "provider": f"{provider}-plugin:9000",
                    "providerId": f"{provider}.fleetupgrade.io/fleet",
                    "providerName": provider,
                },
            },
        )
        objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cu, status)
    code, out, _ = cli(control_plane, objects.ns, "status", "solo", capsys=capsys)
    assert code == 0
    assert "Providers: eks-prod 1/2 upgraded, gke-prod 0/1 upgraded" in out
    assert "  CLUSTER  PROVIDER  STAGE   PHASE                  STEP" in out
    assert "  g1       gke-prod  canary  UpgradingControlPlane  controlPlane" in out
    assert "  e1 (provider eks-prod, stage canary, attempt 1): OperationFailed: boom" in out
    rows = _table(control_plane, objects.ns, api.CLUSTER_UPGRADE_PLURAL)
    assert {n: row["Provider"] for n, row in rows.items() if n.startswith("solo-")} == {
        "solo-g1": "gke-prod",
        "solo-e1": "eks-prod",
        "solo-e2": "eks-prod",
    }


def test_unknown_object_names_the_fix(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(control_plane, objects.ns, "status", "nope", capsys=capsys)
    assert (code, out) == (1, "")
    assert f"no ClusterVersion or UpdateRun named 'nope' in namespace {objects.ns!r}" in err
    assert "kubectl get clusterversions,updateruns" in err


def test_history_lists_the_runs(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run the bounded status history no longer lists is still shown, from its labels.
    old = objects.kube.create_object(
        api.UPDATE_RUN_PLURAL,
        objects.ns,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.UPDATE_RUN_KIND,
            "metadata": {"name": "prod-0", "labels": {api.LABEL_CLUSTER_VERSION: "prod"}},
            "spec": {"opsEndpoint": {"endpoint": "127.0.0.1:1", "insecure": True}},
        },
    )
    objects.write_status(
        api.UPDATE_RUN_PLURAL,
        old,
        {
            "phase": "Succeeded",
            "startTime": "2026-11-20T01:00:00Z",
            "endTime": "2026-11-20T02:00:00Z",
        },
    )
    code, out, _ = cli(control_plane, objects.ns, "history", "prod", capsys=capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "PHASE", "STARTED", "ENDED", "MESSAGE"]
    assert lines[1].split() == ["prod-1", "Progressing", "2026-11-23T01:00:00Z", "-"]
    assert lines[2].split() == [
        "prod-0",
        "Succeeded",
        "2026-11-20T01:00:00Z",
        "2026-11-20T02:00:00Z",
    ]
    code, _, err = cli(control_plane, objects.ns, "history", "prod-1", capsys=capsys)
    assert code == 1 and "is an UpdateRun" in err


def test_approve_adds_the_stage(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = api.ANNOTATION_APPROVE_STAGES
    assert cli(control_plane, objects.ns, "approve", "prod", "canary", capsys=capsys)[0] == 0
    assert cli(control_plane, objects.ns, "approve", "prod", "wave-1", capsys=capsys)[0] == 0
    assert cli(control_plane, objects.ns, "approve", "prod", "wave-1", capsys=capsys)[0] == 0
    assert objects.annotations(api.PLURAL, "prod")[key] == "canary,wave-1"
    # The current run of a ClusterVersion: written on the ClusterVersion, which keeps its
    # run's approve-stages in step with its own (a value on the run alone would be undone).
    code, out, err = cli(control_plane, objects.ns, "approve", "prod-1", "wave-1", capsys=capsys)
    assert code == 0
    assert out == f"ClusterVersion {objects.ns}/prod: {key}=canary,wave-1\n"
    assert "note: UpdateRun prod-1 is the current run of ClusterVersion prod" in err
    assert key not in objects.annotations(api.UPDATE_RUN_PLURAL, "prod-1")
    # A run applied directly.
    objects.standalone()
    assert cli(control_plane, objects.ns, "approve", "solo", "wave-1", capsys=capsys)[0] == 0
    assert objects.annotations(api.UPDATE_RUN_PLURAL, "solo")[key] == "wave-1"
    code, _, err = cli(control_plane, objects.ns, "approve", "prod", "wave-9", capsys=capsys)
    assert code == 1
    assert "ClusterVersion 'prod' has no stage 'wave-9': its stages are canary, wave-1" in err
    assert objects.annotations(api.PLURAL, "prod")[key] == "canary,wave-1"


def test_retry_and_skip_merge_with_what_is_there(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(control_plane, objects.ns, "retry", "prod", "c3", "c2", capsys=capsys)
    assert code == 0
    assert "note: c2 is UpgradingNodePools, not Failed, Blocked or Skipped" in err
    # "c9" was there before: kept (the controller consumes it), the new ids added once.
    cv = objects.annotations(api.PLURAL, "prod")
    assert cv[api.ANNOTATION_RETRY_CLUSTERS] == "c9,c3,c2"
    # Who asked, in the same write: the kubeconfig context's user (the control plane's admin).
    assert cv[api.ANNOTATION_REQUESTED_BY] == "admin"
    assert api.ANNOTATION_REASON not in cv
    assert cli(control_plane, objects.ns, "skip", "prod", "c4", capsys=capsys)[0] == 0
    # Named by its current run: written on the ClusterVersion (it hands skips to the run).
    code, out, err = cli(
        control_plane,
        objects.ns,
        "skip",
        "prod-1",
        "c3",
        "c4",
        "c1",
        "c2",
        "--reason",
        "quota in europe-west1, CHG-1234",
        "--requested-by",
        "jane@example.com",
        capsys=capsys,
    )
    assert code == 0
    assert "note: c1 is Upgraded already: skip does nothing to it" in err
    assert "note: c2 is UpgradingNodePools (in flight): skip applies to Pending" in err
    assert "note: UpdateRun prod-1 is the current run of ClusterVersion prod" in err
    cv = objects.annotations(api.PLURAL, "prod")
    assert cv[api.ANNOTATION_SKIP_CLUSTERS] == "c4,c3,c1,c2"
    assert cv[api.ANNOTATION_REASON] == "quota in europe-west1, CHG-1234"
    assert cv[api.ANNOTATION_REQUESTED_BY] == "jane@example.com"
    assert out == f"ClusterVersion {objects.ns}/prod: {api.ANNOTATION_SKIP_CLUSTERS}=c4,c3,c1,c2\n"
    assert api.ANNOTATION_SKIP_CLUSTERS not in objects.annotations(api.UPDATE_RUN_PLURAL, "prod-1")
    # A later request without --reason does not inherit the earlier one.
    assert cli(control_plane, objects.ns, "retry", "prod", "c3", capsys=capsys)[0] == 0
    cv = objects.annotations(api.PLURAL, "prod")
    assert api.ANNOTATION_REASON not in cv
    assert cv[api.ANNOTATION_REQUESTED_BY] == "admin"
    # A run applied directly takes them itself.
    objects.standalone()
    code, out, _ = cli(
        control_plane, objects.ns, "skip", "solo", "c2", "--reason", "spare", capsys=capsys
    )
    assert code == 0 and out == f"UpdateRun {objects.ns}/solo: {api.ANNOTATION_SKIP_CLUSTERS}=c2\n"
    solo = objects.annotations(api.UPDATE_RUN_PLURAL, "solo")
    assert solo[api.ANNOTATION_REASON] == "spare"
    assert solo[api.ANNOTATION_REQUESTED_BY] == "admin"
    code, _, err = cli(control_plane, objects.ns, "skip", "prod", "c4", "zz", capsys=capsys)
    assert code == 1
    assert "ClusterVersion 'prod' has no cluster 'zz': its clusters are c1, c2, c3, c4" in err
    # Nothing was written: the annotation is as the last successful skip left it.
    assert objects.annotations(api.PLURAL, "prod")[api.ANNOTATION_SKIP_CLUSTERS] == "c4,c3,c1,c2"


def test_skip_a_stage(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        control_plane,
        objects.ns,
        "skip",
        "prod",
        "--stage",
        "wave-1",
        "--reason",
        "wave-1 moves to next week",
        capsys=capsys,
    )
    assert (code, err) == (0, "")
    assert out == f"ClusterVersion {objects.ns}/prod: {api.ANNOTATION_SKIP_STAGES}=wave-1\n"
    cv = objects.annotations(api.PLURAL, "prod")
    assert cv[api.ANNOTATION_SKIP_STAGES] == "wave-1"
    assert cv[api.ANNOTATION_REASON] == "wave-1 moves to next week"
    assert cv[api.ANNOTATION_REQUESTED_BY] == "admin"
    # Level-triggered like approve-stages: a stage added keeps the others; a finished one is
    # accepted with a note.
    code, _, err = cli(
        control_plane, objects.ns, "skip", "prod", "--stage", "canary", capsys=capsys
    )
    assert code == 0
    assert "note: stage canary is Completed: skip changes nothing" in err
    assert objects.annotations(api.PLURAL, "prod")[api.ANNOTATION_SKIP_STAGES] == "wave-1,canary"
    _, out, _ = cli(control_plane, objects.ns, "status", "prod", capsys=capsys)
    assert "Skipped stages: wave-1, canary" in out
    # An unknown stage is named, with the stages there are; nothing is written.
    objects.standalone()
    code, _, err = cli(control_plane, objects.ns, "skip", "solo", "--stage", "wave9", capsys=capsys)
    assert code == 1
    assert "UpdateRun 'solo' has no stage 'wave9': its stages are canary, wave-1" in err
    assert api.ANNOTATION_SKIP_STAGES not in objects.annotations(api.UPDATE_RUN_PLURAL, "solo")
    code, _, err = cli(control_plane, objects.ns, "skip", "prod", capsys=capsys)
    assert code == 1 and "name the clusters to skip, or a stage with --stage STAGE" in err


def test_a_concurrent_consume_is_not_undone(control_plane: KubeCluster, objects: Objects) -> None:
    """The controller consumes retry-clusters between the CLI's read and its write: the write
    (conditional on the resourceVersion it read) is redone from a fresh read, so the consumed
    id does not come back."""
    target = resolve(objects.kube, objects.ns, "prod")  # reads c9
    objects.kube.merge_patch(
        api.PLURAL,
        objects.ns,
        "prod",
        {"metadata": {"annotations": {api.ANNOTATION_RETRY_CLUSTERS: None}}},
    )
    merged = verbs._annotate(objects.kube, target, {api.ANNOTATION_RETRY_CLUSTERS: ["c3"]})
    assert merged == {api.ANNOTATION_RETRY_CLUSTERS: "c3"}
    assert objects.annotations(api.PLURAL, "prod")[api.ANNOTATION_RETRY_CLUSTERS] == "c3"


def test_stop_and_resume_the_current_run(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(control_plane, objects.ns, "stop", "prod", capsys=capsys)
    assert code == 0 and f"UpdateRun {objects.ns}/prod-1: spec.state=Stop" in out
    assert objects.state("prod-1") == "Stop"
    _, out, _ = cli(control_plane, objects.ns, "status", "prod", capsys=capsys)
    assert "Stopping: spec.state is Stop (resume: fleet-orchestrator resume prod)" in out
    assert cli(control_plane, objects.ns, "resume", "prod-1", capsys=capsys)[0] == 0
    assert objects.state("prod-1") == "Run"
    # A ClusterVersion without a run yet.
    objects.kube.create_object(
        api.PLURAL,
        objects.ns,
        {
            "apiVersion": api.API_VERSION,
            "kind": "ClusterVersion",
            "metadata": {"name": "fresh"},
            "spec": {"opsEndpoint": {"endpoint": "127.0.0.1:1", "insecure": True}},
        },
    )
    code, _, err = cli(control_plane, objects.ns, "stop", "fresh", capsys=capsys)
    assert code == 1 and "ClusterVersion 'fresh' has no current run" in err


def test_render_of_a_snapshot() -> None:
    snap = Snapshot(
        kind="UpdateRun",
        namespace="ns",
        name="r",
        phase="Progressing",
        message="waiting for approval of stage b",
        counts={"total": 3, "upgraded": 1, "pending": 2},
        current_stage="b",
        stages=(
            StageLine("a", "Completed", 1, 1, 0),
            StageLine("b", "AwaitingApproval", 2, 0, 0, max_failures=1),
        ),
        blocked=(ClusterLine("x", "b", "Blocked"),),
        failures=api.FailureSummary(count=0),
        now=NOW,
    )
    assert render(snap) == (
        "UpdateRun ns/r: Progressing\n"
        "  waiting for approval of stage b\n"
        "Clusters: 3 total, 1 upgraded, 0 in flight, 2 pending, 0 failed, 0 blocked, 0 skipped\n"
        "Failure budget: 0 failed (no limit)\n"
        "Stages:\n"
        "  STAGE  PHASE             PROGRESS              UPGRADED  SKIPPED  FAILED  MAX-FAILURES\n"
        "  a      Completed         ████████████████████  1/1       0        0       -\n"
        "  b      AwaitingApproval  ░░░░░░░░░░░░░░░░░░░░  0/2       0        0       1"
        "             <- current\n"
        "Blocked (1):\n"
        "  x (stage b, attempt 1): no reason recorded\n"
        "Stage b awaits approval: fleet-orchestrator approve r b\n"
    )


def test_a_provider_of_several_down_is_shown_beside_the_progress_not_as_a_stop() -> None:
    """engine.conditions: Degraded ProviderUnavailable leaves the run going (the others go on
    where the floor allows): `status` says it, and not as `Cannot progress`."""
    message = "unavailable: FleetProvider aks-prod (UNAVAILABLE: down)"
    degraded = {"type": "Degraded", "status": "True", "reason": "ProviderUnavailable"}
    degraded |= {"message": message, "lastTransitionTime": "2026-11-23T01:00:00Z"}
    assert cause({"conditions": [degraded]}) == ""
    snap = Snapshot(
        kind="UpdateRun",
        namespace="ns",
        name="r",
        phase="Progressing",
        degraded=f"ProviderUnavailable: {message}",
        now=NOW,
    )
    text = render(snap)
    assert f"  Degraded: ProviderUnavailable: {message}\n" in text
    assert "Cannot progress" not in text
    unreachable = degraded | {"reason": "PluginUnavailable"}
    assert cause({"conditions": [unreachable]}).startswith("PluginUnavailable: ")


def test_long_lists_are_cut_short() -> None:
    """At fleet scale the view stays a screen: 20 clusters per section, the rest counted with
    the kubectl command that lists them."""
    snap = Snapshot(
        kind="UpdateRun",
        namespace="ns",
        name="r",
        phase="Progressing",
        in_flight=tuple(ClusterLine(f"f{i:03}", "s", "Verifying") for i in range(300)),
        failed=tuple(ClusterLine(f"x{i:03}", "s", "Failed") for i in range(25)),
        now=NOW,
    )
    lines = render(snap).splitlines()
    assert (
        lines.count("  ... and 280 more: kubectl get cu -n ns -l multicluster-ops.io/update-run=r")
        == 1
    )
    assert "  ... and 5 more: kubectl get cu -n ns -l multicluster-ops.io/update-run=r" in lines
    assert sum(1 for line in lines if line.startswith("  f")) == 20
    retry = next(line for line in lines if line.startswith("  retry:"))
    assert retry.split()[4:] == [f"x{i:03}" for i in range(20)]


def test_live_view_as_rich_renders_it() -> None:
    """The live view through a rich Console (what --watch draws on a terminal): progress bars
    with done and failed cells, the budget past its limit, the wait with its countdown, ages of
    the clusters in flight, and colour on a terminal."""
    snap = Snapshot(
        kind="UpdateRun",
        namespace="ns",
        name="r",
        phase="Halted",
        counts={"total": 10, "upgraded": 4, "inFlight": 1, "failed": 2},
        current_stage="wave",
        stages=(
            StageLine("canary", "Completed", 2, 2, 0, max_failures=0),
            StageLine("wave", "Failed", 8, 2, 2, max_failures=1),
        ),
        in_flight=(ClusterLine("c5", "wave", "Verifying", "", 1, since="2026-11-23T00:12:00Z"),),
        failed=(
            ClusterLine("c7", "wave", "Failed", attempt=1, reason="PreUpgradeHookFailed"),
            ClusterLine("c8", "wave", "Failed", attempt=0, reason="StepTimedOut"),
        ),
        failures=api.FailureSummary(count=2, max_failures=1, clusters=["c7", "c8"]),
        next_start_time="2026-11-24T02:00:00Z",
        waiting_reason="the maintenance window is closed",
        now=NOW,
    )
    console = Console(
        file=io.StringIO(), record=True, width=120, force_terminal=True, color_system="truecolor"
    )
    console.print(renderable(snap))
    text = console.export_text(styles=False, clear=False)
    lines = text.splitlines()
    assert lines[0] == "UpdateRun ns/r: Halted"
    assert "Failure budget: 2 failed of 1 allowed (exceeded: the run halts): c7, c8" in lines
    assert (
        "Waiting: the maintenance window is closed; next start 2026-11-24T02:00:00Z (in 1d0h)"
        in lines
    )
    assert "  canary  Completed  ████████████████████  2/2       0        0       0" in lines
    assert (
        "  wave    Failed     █████✗✗✗✗✗░░░░░░░░░░  2/8       0        2       1             "
        "<- current" in lines
    )
    assert "  c5       wave   Verifying  -     1h2m" in lines
    assert "  c7 (stage wave, attempt 2): PreUpgradeHookFailed" in lines
    assert "  retry: fleet-orchestrator retry r c7 c8" in lines
    # On a terminal the phases and the bar are coloured (ANSI SGR codes in the output).
    styled = console.export_text(styles=True)
    assert "\x1b[1;31mHalted" in styled
    assert "\x1b[32m█████\x1b[0m\x1b[1;31m✗✗✗✗✗" in styled


def test_status_watch_rerenders_on_change(control_plane: KubeCluster, objects: Objects) -> None:
    objects.timeless()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "status",
            "prod",
            "--watch",
            "--interval",
            "0.2",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "-n",
            objects.ns,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(proc.stdout or []), name="watch-output", daemon=True
    )
    reader.start()

    def output() -> str:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        return "".join(lines)

    try:
        wait_for("the first render", lambda: "Current run: prod-1" in output(), timeout=20)
        objects.kube.merge_patch(
            api.UPDATE_RUN_PLURAL, objects.ns, "prod-1", {"spec": {"state": "Stop"}}
        )
        wait_for("a second render", lambda: "Stopping: spec.state is Stop" in output(), timeout=20)
        # Nothing else changes: a second more of reads (five intervals) renders nothing new.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert output().count("--- ") == 2, output()
            time.sleep(0.1)
        first, second = output().split("--- ")[1:]
        assert "Stopping" not in first and "c3 (stage wave-1, attempt 1)" in first
        assert second.split("\n", 1)[1] == first.split("\n", 1)[1].replace(
            "Current run: prod-1 (Progressing)\n",
            "Current run: prod-1 (Progressing)\n"
            "Stopping: spec.state is Stop (resume: fleet-orchestrator resume prod)\n",
        )
        # A failed read is shown and the watch goes on.
        objects.kube.delete_object(api.PLURAL, objects.ns, "prod")
        wait_for(
            "the error rendered",
            lambda: "error: no ClusterVersion or UpdateRun named 'prod'" in output(),
            timeout=20,
        )
        assert output().count("--- ") == 3
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _tmux() -> str:
    """tmux, or fail with the command that installs it (scripts/ensure-test-tools does)."""
    binary = shutil.which("tmux")
    if binary is None:
        pytest.fail(
            "tmux is not installed: run scripts/ensure-test-tools "
            "(or: sudo apt-get install -y --no-install-recommends tmux)",
            pytrace=False,
        )
    return binary


def test_status_watch_live_under_tmux(
    control_plane: KubeCluster, objects: Objects, tmp_path: Path
) -> None:
    """`status --watch` on a real terminal: started in a detached tmux session, it redraws in
    place when the run's status changes, and Ctrl-C (send-keys) leaves it with exit code 0."""
    tmux = _tmux()
    socket = tmp_path / "tmux.sock"

    def run_tmux(*args: str) -> str:
        done = subprocess.run(
            [tmux, "-S", str(socket), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    command = shlex.join(
        [
            str(ROOT / ".venv" / "bin" / "fleet-orchestrator"),
            "status",
            "prod",
            "--watch",
            "--interval",
            "0.2",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "-n",
            objects.ns,
        ]
    )
    run_tmux(
        "new-session", "-d", "-s", "watch", "-x", "150", "-y", "50", "-c", str(ROOT),
        f"{command}; echo EXITED $?; sleep 600",
    )  # fmt: skip

    def screen() -> str:
        return run_tmux("capture-pane", "-p", "-t", "watch")

    try:
        first = wait_for(
            "the first render", lambda: "Current run: prod-1" in screen() and screen(), timeout=30
        )
        assert "Failure budget: 1 failed of 1 allowed: c3" in first
        assert "wave-1  Progressing  ✗✗✗✗✗✗✗░░░░░░░░░░░░░  0/3" in first
        # The controller's part: c2 is upgraded, c4 fails, the run halts past its budget.
        for cluster, phase in (("c2", "Upgraded"), ("c4", "Failed")):
            cu = objects.kube.get_object(
                api.CLUSTER_UPGRADE_PLURAL, objects.ns, f"prod-1-{cluster}"
            )
            objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cu, {"phase": phase})
        run = objects.kube.get_object(api.UPDATE_RUN_PLURAL, objects.ns, "prod-1")
        status = dict(run["status"])
        status.update(
            phase="Halted",
            counts={"total": 4, "upgraded": 2, "failed": 2},
            failures={"count": 2, "maxFailures": 1, "clusters": ["c3", "c4"]},
            stages=[
                {"name": "canary", "phase": "Completed", "total": 1, "upgraded": 1},
                {"name": "wave-1", "phase": "Failed", "total": 3, "upgraded": 1, "failed": 2},
            ],
        )
        del status["waitingReason"], status["nextStartTime"]
        objects.write_status(api.UPDATE_RUN_PLURAL, run, status)
        after = wait_for(
            "the change on screen",
            lambda: (
                "2 failed of 1 allowed (exceeded: the run halts): c3, c4" in screen()
                and "1/3" in screen()
                and screen()
            ),
            timeout=20,
        )
        assert "wave-1  Failed     ███████✗✗✗✗✗✗✗✗✗✗✗✗✗  1/3" in after
        assert "Waiting:" not in after
        # Redrawn in place: the screen holds one view, not the old one followed by the new.
        assert after.count(f"ClusterVersion {objects.ns}/prod:") == 1
        assert "1 failed of 1 allowed" not in after
        run_tmux("send-keys", "-t", "watch", "C-c")
        wait_for("the watch to end", lambda: "EXITED 0" in screen(), timeout=20)
    finally:
        subprocess.run(
            [tmux, "-S", str(socket), "kill-server"], capture_output=True, timeout=10, check=False
        )


def _table(control_plane: KubeCluster, namespace: str, plural: str) -> dict[str, dict[str, Any]]:
    """What `kubectl get PLURAL -o wide` prints, as the apiserver answers it (a meta.k8s.io
    Table with every column, priority 1 included): row name -> column name -> cell."""
    api_client = control_plane.api_client()
    try:
        request = api_client.param_serialize(
            "GET",
            f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{plural}",
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(*request)
        table = json.loads(response.read())
    finally:
        api_client.close()
    assert table["kind"] == "Table", table
    names = [c["name"] for c in table["columnDefinitions"]]
    return {
        row["object"]["metadata"]["name"]: dict(zip(names, row["cells"], strict=True))
        for row in table["rows"]
    }


def test_printer_columns_show_phase_progress_failures_and_age(
    control_plane: KubeCluster, objects: Objects
) -> None:
    cv = _table(control_plane, objects.ns, api.PLURAL)["prod"]
    assert {k: v for k, v in cv.items() if k != "Age"} == {
        "Name": "prod",
        "Phase": "Progressing",
        "Run": "prod-1",
        "Up-To-Date": 1,
        "Total": 4,
        "Failed": 1,
        "Stage": "wave-1",
        "Degraded": None,
        "Message": "stage wave-1: 1 cluster in flight",
    }
    run = _table(control_plane, objects.ns, api.UPDATE_RUN_PLURAL)["prod-1"]
    assert {k: v for k, v in run.items() if k != "Age"} == {
        "Name": "prod-1",
        "State": "Run",
        "Phase": "Progressing",
        "Stage": "wave-1",
        "Upgraded": 1,
        "In-Flight": 1,
        "Failed": 1,
        "Total": 4,
        "Max-Failures": 1,
        "Next-Start": "2026-11-23T04:00:00Z",
        "Degraded": None,
        "Waiting": "c4: its maintenance window is closed",
        "Message": None,
    }
    upgrades = _table(control_plane, objects.ns, api.CLUSTER_UPGRADE_PLURAL)
    c3 = upgrades["prod-1-c3"]
    assert {k: v for k, v in c3.items() if k not in ("Age", "Since")} == {
        "Name": "prod-1-c3",
        "Cluster": "c3",
        "Stage": "wave-1",
        "Target": "1.29.1",
        "Phase": "Failed",
        "Step": None,
        "Reason": "StepTimedOut",
        "Provider": None,
        "Retries": 0,
        "Message": "controlPlane took longer than 90m",
    }
    assert upgrades["prod-1-c2"]["Step"] == "nodePool/a"
    # Age and Since are durations the apiserver computes from the timestamps (kubectl's AGE).
    for row in (cv, run, c3):
        assert re.fullmatch(r"[0-9]+[smhd].*", str(row["Age"])), row
    assert re.fullmatch(r"[0-9]+[smhd].*", str(c3["Since"])), c3


def _upgrade_lists(control_plane: KubeCluster) -> float:
    """Requests the apiserver counted as LISTs of clusterupgrades (apiserver_request_total).

    This apiserver counts a GET of one custom object under the LIST verb too, so a test that
    counts LISTs reads no ClusterUpgrade by name meanwhile.
    """
    api_client = control_plane.api_client()
    try:
        request = api_client.param_serialize(
            "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )
        text = api_client.call_api(*request).read().decode()
    finally:
        api_client.close()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{")
        and 'resource="clusterupgrades"' in line
        and 'verb="LIST"' in line
    )


def test_watch_keeps_the_upgrades_current_with_one_list(
    control_plane: KubeCluster, objects: Objects
) -> None:
    """`status --watch` reads the run's ClusterUpgrades through an UpgradeCache: one LIST,
    then the watch's changes (across the watch's own restarts); another run lists again."""
    cache = operate.UpgradeCache(objects.kube, objects.ns, watch_seconds=3)
    lists = _upgrade_lists(control_plane)

    def phases() -> dict[str, str]:
        return {o["spec"]["clusterId"]: o["status"]["phase"] for o in cache("prod-1")}

    def cached(cluster: str) -> dict[str, Any]:
        return next(o for o in cache("prod-1") if o["spec"]["clusterId"] == cluster)

    expected = {"c1": "Upgraded", "c2": "UpgradingNodePools", "c3": "Failed", "c4": "Blocked"}
    assert phases() == expected
    # Written with the cached resourceVersion: the write is refused unless the cache is current.
    objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cached("c2"), {"phase": "Verifying"})
    objects.kube.delete_object(api.CLUSTER_UPGRADE_PLURAL, objects.ns, "prod-1-c4")
    objects.standalone()
    objects.kube.create_object(
        api.CLUSTER_UPGRADE_PLURAL,
        objects.ns,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.CLUSTER_UPGRADE_KIND,
            "metadata": {"name": "solo-c1", "labels": {api.LABEL_RUN: "solo"}},
            "spec": {
                "clusterId": "c1",
                "stage": "canary",
                "stageIndex": 0,
                "version": "1.29.1",
                "nodeVersion": "1.29.1",
                "provider": "127.0.0.1:1",
            },
        },
    )
    expected = {"c1": "Upgraded", "c2": "Verifying", "c3": "Failed"}
    wait_for("the watch to bring the changes", lambda: phases() == expected, timeout=20)
    # Past the watch's own timeout (3 s) it carries on from where it stood.
    time.sleep(4)
    objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cached("c3"), {"phase": "Pending"})
    expected["c3"] = "Pending"
    wait_for("a change after the watch restarted", lambda: phases() == expected, timeout=20)
    objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cached("c3"), {"phase": "Failed"})
    expected["c3"] = "Failed"
    wait_for("the next change", lambda: phases() == expected, timeout=20)
    assert _upgrade_lists(control_plane) - lists == 1
    # Another run: listed once, its own objects only.
    assert [o["metadata"]["name"] for o in cache("solo")] == ["solo-c1"]
    assert _upgrade_lists(control_plane) - lists == 2
