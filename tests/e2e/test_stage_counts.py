"""Issue 24 item 5, at the source: a stage's counts as the orchestrator stores them.

The real `fleet-orchestrator run` against the local apiserver and the sim: a stage with a cluster
a person skipped (spec.skip) and a stage with a cluster whose target the provider refuses
(Blocked, Refused). What the controller writes in `status.stages` (`kubectl get ur -o yaml`, the
ClusterVersion's copy), what `kubectl get ur -o wide` prints and what `fleet-orchestrator status`
renders say the same numbers: the skipped cluster apart from the upgraded ones, the refused one
counted as the stage's failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from tests.e2e.conftest import (
    NEW,
    OLD,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl

#: From OLD (1.28.5) the sim refuses it: a minor version skipped (FAILED_PRECONDITION).
SKIPPED_MINOR = "1.30.2"


def _printed(text: str) -> dict[str, dict[str, str]]:
    """kubectl's table as printed: row name -> column header -> cell."""
    header, *rows = text.splitlines()
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    out = {}
    for row in rows:
        cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out[cells[0]] = dict(zip(names, cells, strict=True))
    return out


def test_stored_stage_counts_agree_with_kubectl_and_status(
    sim: Callable[..., Sim],
    control_plane: KubeCluster,
    objects: Objects,
    orchestrators: Orchestrators,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet = sim(fleet_file(6, step=0.2))
    orchestrators.start()
    body: dict[str, Any] = cluster_version(
        "fleet",
        fleet.address,
        ids(6),
        4,
        strategy={
            "maxConcurrency": 1,
            "stages": [
                {"name": "one", "clusters": ids(4)},
                {"name": "two", "clusters": ids(6)[4:]},
            ],
        },
        skip={"clusters": ["cluster-03"], "reason": "customer freeze"},
    )
    body["spec"]["clusters"][5]["version"] = SKIPPED_MINOR
    objects.create_cv(body)
    run = objects.current_run("fleet")
    status = wait_for(
        "the run halts on the refused cluster",
        lambda: objects.run_phase_is(run, "Halted"),
        timeout=90,
        interval=0.2,
    )
    # The world: what the counts describe.
    for cid in ("cluster-00", "cluster-01", "cluster-02", "cluster-04"):
        assert fleet.cluster(cid)["controlPlaneVersion"] == NEW, cid
    for cid in ("cluster-03", "cluster-05"):
        assert fleet.cluster(cid)["controlPlaneVersion"] == OLD, cid
        assert fleet.cluster(cid)["inService"] is True, cid
    ups = objects.upgrades(run)
    assert ups["cluster-03"]["status"]["phase"] == "Skipped"
    assert (ups["cluster-05"]["status"]["phase"], ups["cluster-05"]["status"]["reason"]) == (
        "Blocked",
        "Refused",
    )

    # `kubectl get ur RUN -o yaml`: the stored counts, skipped apart, the refusal as a failure.
    stored = yaml.safe_load(
        kubectl(control_plane, "-n", objects.ns, "get", "ur", run, "-o", "yaml")
    )
    counts = {
        s["name"]: (s["phase"], s["total"], s["upgraded"], s.get("skipped"), s.get("failed"))
        for s in stored["status"]["stages"]
    }
    assert counts == {"one": ("Completed", 4, 3, 1, 0), "two": ("Failed", 2, 1, 0, 1)}, counts
    assert stored["status"]["counts"] == {
        "total": 6,
        "pending": 0,
        "inFlight": 0,
        "upgraded": 4,
        "failed": 0,
        "blocked": 1,
        "skipped": 1,
    }
    # The stages add up to the run's counts (a skipped cluster counted as upgraded would not).
    assert sum(s["upgraded"] for s in stored["status"]["stages"]) == 4
    assert sum(s["skipped"] for s in stored["status"]["stages"]) == 1
    # The ClusterVersion carries the same stages (`kubectl get cv -o yaml`).
    cv = wait_for(
        "the ClusterVersion shows the halted run",
        lambda: objects.cv_phase_is("fleet", "Halted"),
        timeout=30,
        interval=0.2,
    )
    assert cv["stages"] == stored["status"]["stages"] == status["stages"]

    # `kubectl get ur -o wide`, as printed.
    row = _printed(kubectl(control_plane, "-n", objects.ns, "get", "ur", "-o", "wide"))[run]
    assert (row["PHASE"], row["UPGRADED"], row["FAILED"], row["TOTAL"]) == ("Halted", "4", "0", "6")

    # `fleet-orchestrator status`: the same numbers.
    code = main(
        ["status", "fleet", "--kubeconfig", str(control_plane.kubeconfig), "-n", objects.ns]
    )
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert (
        "Clusters: 6 total, 4 upgraded, 0 in flight, 0 pending, 0 failed, 1 blocked, 1 skipped"
        in out
    )
    assert (
        "  STAGE  PHASE      PROGRESS              UPGRADED  SKIPPED  FAILED  MAX-FAILURES" in out
    )
    assert "  one    Completed  ███████████████─────  3/4       1        0       -" in out
    assert "  two    Failed     ██████████✗✗✗✗✗✗✗✗✗✗  1/2       0        1       -" in out
    assert not reconcile_errors(orchestrators.logs())
