"""fleet-orchestrator's operator verbs against the real local apiserver: the objects they change
and the status they render (ClusterVersion, UpdateRun and ClusterUpgrades written directly, their
statuses through the status subresource, as the controllers would leave them)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import api
from orchestrator.cli import main
from orchestrator.kube import KubeClient
from orchestrator.operate import ClusterLine, Snapshot, StageLine, render
from tests.support.kube import KubeCluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
STAGES = [
    {"name": "canary", "clusters": ["c1"]},
    {"name": "wave-1", "clusters": ["c2", "c3", "c4"], "approval": "Manual"},
]
CLUSTERS = [{"id": f"c{i}", "version": "1.29.1"} for i in range(1, 5)]
#: What the controllers would have recorded: cluster -> (stage, stage index, status).
UPGRADES: dict[str, tuple[str, int, dict[str, Any]]] = {
    "c1": ("canary", 0, {"phase": "Upgraded", "attempt": 1}),
    "c2": ("wave-1", 1, {"phase": "UpgradingNodePools", "step": "nodePool/a", "attempt": 1}),
    "c3": (
        "wave-1",
        1,
        {
            "phase": "Failed",
            "attempt": 1,
            "reason": "StepTimedOut",
            "message": "controlPlane took longer than 90m",
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
            {"name": "canary", "phase": "Completed", "total": 1, "upgraded": 1},
            {"name": "wave-1", "phase": "Progressing", "total": 3, "upgraded": 0, "failed": 1},
        ]
        self.write_status(
            api.UPDATE_RUN_PLURAL,
            run,
            {
                "phase": "Progressing",
                "currentStage": "wave-1",
                "counts": {"total": 4, "upgraded": 1, "inFlight": 1, "failed": 1, "blocked": 1},
                "stages": stages,
                "startTime": "2026-11-23T01:00:00Z",
            },
        )
        self.write_status(
            api.PLURAL,
            cv,
            {
                "phase": "Progressing",
                "currentRun": "prod-1",
                "currentStage": "wave-1",
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
    assert "wave-1  Progressing  0/3       1       <- current" in out
    assert "c2       wave-1  UpgradingNodePools  nodePool/a" in out
    assert "c3 (stage wave-1, attempt 1): StepTimedOut: controlPlane took longer than 90m" in out
    assert "c4 (stage wave-1): ClaimHeld: claimed by team-b/other" in out
    assert "retry: fleet-orchestrator retry prod c3" in out
    # The worked example of docs/operations.md ("Operating from the CLI") is this output.
    docs = (ROOT / "docs" / "operations.md").read_text()
    example = docs.split("$ fleet-orchestrator status prod -n team-a\n", 1)[1].split("\n$ ", 1)[0]
    assert out == example.replace("team-a", objects.ns) + "\n"


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
    # On a run directly.
    assert cli(control_plane, objects.ns, "approve", "prod-1", "wave-1", capsys=capsys)[0] == 0
    assert objects.annotations(api.UPDATE_RUN_PLURAL, "prod-1")[key] == "wave-1"
    code, _, err = cli(control_plane, objects.ns, "approve", "prod", "wave-9", capsys=capsys)
    assert code == 1
    assert "ClusterVersion 'prod' has no stage 'wave-9': its stages are canary, wave-1" in err
    assert objects.annotations(api.PLURAL, "prod")[key] == "canary,wave-1"


def test_retry_and_skip_merge_with_what_is_there(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(control_plane, objects.ns, "retry", "prod", "c3", "c2", capsys=capsys)
    assert code == 0
    assert "note: c2 is UpgradingNodePools, not Failed: retry does nothing to it" in err
    # "c9" was there before: kept (the controller consumes it), the new ids added once.
    assert objects.annotations(api.PLURAL, "prod")[api.ANNOTATION_RETRY_CLUSTERS] == "c9,c3,c2"
    assert cli(control_plane, objects.ns, "skip", "prod-1", "c4", capsys=capsys)[0] == 0
    assert cli(control_plane, objects.ns, "skip", "prod-1", "c3", "c4", capsys=capsys)[0] == 0
    run_annotations = objects.annotations(api.UPDATE_RUN_PLURAL, "prod-1")
    assert run_annotations[api.ANNOTATION_SKIP_CLUSTERS] == "c4,c3"
    code, _, err = cli(control_plane, objects.ns, "skip", "prod", "c4", "zz", capsys=capsys)
    assert code == 1
    assert "ClusterVersion 'prod' has no cluster 'zz': its clusters are c1, c2, c3, c4" in err
    assert api.ANNOTATION_SKIP_CLUSTERS not in objects.annotations(api.PLURAL, "prod")


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
            StageLine("b", "AwaitingApproval", 2, 0, 0),
        ),
        blocked=(ClusterLine("x", "b", "Blocked"),),
    )
    assert render(snap) == (
        "UpdateRun ns/r: Progressing\n"
        "  waiting for approval of stage b\n"
        "Clusters: 3 total, 1 upgraded, 0 in flight, 2 pending, 0 failed, 0 blocked, 0 skipped\n"
        "Stages:\n"
        "  STAGE  PHASE             UPGRADED  FAILED\n"
        "  a      Completed         1/1       0\n"
        "  b      AwaitingApproval  0/2       0       <- current\n"
        "Blocked (1):\n"
        "  x (stage b): no reason recorded\n"
        "Stage b awaits approval: fleet-orchestrator approve r b\n"
    )


def test_status_watch_rerenders_on_change(control_plane: KubeCluster, objects: Objects) -> None:
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
