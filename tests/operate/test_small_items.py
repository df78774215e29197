"""What people read in `kubectl get` and `fleet-orchestrator status` for the small things issue
24 found wrong: a pending ClusterUpgrade's PHASE, attempts counted from 1, skipped clusters
apart from upgraded ones, and a stage failed by a Blocked cluster (real apiserver)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import api
from tests.operate.test_cli import Objects, _table, cli, objects
from tests.support.kube import KubeCluster

__all__ = ["objects"]  # the fixture, shared with test_cli


def _upgrade(objects: Objects, run: str, cluster: str, stage: str, index: int) -> dict[str, Any]:
    return objects.kube.create_object(
        api.CLUSTER_UPGRADE_PLURAL,
        objects.ns,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.CLUSTER_UPGRADE_KIND,
            "metadata": {"name": f"{run}-{cluster}", "labels": {api.LABEL_RUN: run}},
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


def test_a_pending_cluster_upgrade_shows_pending(
    control_plane: KubeCluster, objects: Objects
) -> None:
    # Created as the run pins it: no status yet (the status subresource drops one on create).
    made = _upgrade(objects, "prod-1", "c5", "wave-1", 1)
    assert "status" not in made or made["status"] == {"phase": "Pending"}
    row = _table(control_plane, objects.ns, api.CLUSTER_UPGRADE_PLURAL)["prod-1-c5"]
    assert (row["Phase"], row["Retries"]) == ("Pending", None)
    # What the controllers write replaces it whole, as before.
    cu = objects.kube.get_object(api.CLUSTER_UPGRADE_PLURAL, objects.ns, "prod-1-c5")
    objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cu, {"phase": "ServicingOut", "attempt": 0})
    row = _table(control_plane, objects.ns, api.CLUSTER_UPGRADE_PLURAL)["prod-1-c5"]
    assert (row["Phase"], row["Retries"]) == ("ServicingOut", 0)


def test_attempts_are_counted_from_one_for_people(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    # status.attempt 1 is the second attempt (a retry): RETRIES 1 in kubectl, "attempt 2" in
    # status, as the retry's Event says ("retry requested by ... (attempt 2)").
    cu = objects.kube.get_object(api.CLUSTER_UPGRADE_PLURAL, objects.ns, "prod-1-c3")
    objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cu, {**cu["status"], "attempt": 1})
    assert (
        _table(control_plane, objects.ns, api.CLUSTER_UPGRADE_PLURAL)["prod-1-c3"]["Retries"] == 1
    )
    out = cli(control_plane, objects.ns, "status", "prod", capsys=capsys)[1]
    assert "  c3 (stage wave-1, attempt 2): StepTimedOut: controlPlane took longer than 90m" in out


def test_a_stage_shows_skipped_apart_and_a_refused_cluster_as_failed(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    run = objects.kube.create_object(
        api.UPDATE_RUN_PLURAL,
        objects.ns,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.UPDATE_RUN_KIND,
            "metadata": {"name": "solo"},
            "spec": {
                "opsEndpoint": {"endpoint": "127.0.0.1:1", "insecure": True},
                "clusters": [{"id": f"s{i}", "version": "1.29.1"} for i in range(1, 7)],
                "strategy": {
                    "stages": [
                        {"name": "one", "clusters": ["s1", "s2", "s3", "s4"]},
                        {"name": "two", "clusters": ["s5", "s6"]},
                    ]
                },
            },
        },
    )
    outcomes = {
        "s1": ("one", 0, {"phase": "Upgraded"}),
        "s2": ("one", 0, {"phase": "Upgraded"}),
        "s3": ("one", 0, {"phase": "Upgraded"}),
        "s4": ("one", 0, {"phase": "Skipped", "reason": "SkippedByUser"}),
        "s5": ("two", 1, {"phase": "Upgraded"}),
        "s6": (
            "two",
            1,
            {"phase": "Blocked", "reason": "Refused", "message": "1.29 to 1.31 skips a minor"},
        ),
    }
    for cluster, (stage, index, status) in outcomes.items():
        cu = _upgrade(objects, "solo", cluster, stage, index)
        objects.write_status(api.CLUSTER_UPGRADE_PLURAL, cu, status)
    # The run's status as the controller writes it (engine.decide; tests/e2e/test_stage_counts.py
    # has the controller write it): the skipped cluster apart from the upgraded ones, the
    # refused one counted as the stage's failure.
    objects.write_status(
        api.UPDATE_RUN_PLURAL,
        run,
        {
            "phase": "Halted",
            "counts": {"total": 6, "upgraded": 4, "skipped": 1, "blocked": 1},
            "stages": [
                {"name": "one", "phase": "Completed", "total": 4, "upgraded": 3, "skipped": 1},
                {"name": "two", "phase": "Failed", "total": 2, "upgraded": 1, "failed": 1},
            ],
        },
    )
    code, out, _ = cli(control_plane, objects.ns, "status", "solo", capsys=capsys)
    assert code == 0
    assert (
        "  STAGE  PHASE      PROGRESS              UPGRADED  SKIPPED  FAILED  MAX-FAILURES" in out
    )
    assert "  one    Completed  ███████████████─────  3/4       1        0       -" in out
    assert "  two    Failed     ██████████✗✗✗✗✗✗✗✗✗✗  1/2       0        1       -" in out
    assert "  s6 (stage two, attempt 1): Refused: 1.29 to 1.31 skips a minor" in out
