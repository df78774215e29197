"""Issue 11, failure 6: `fleet-orchestrator plan` finishes for a spec with healthChecks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.e2e.conftest import NEW, Sim, cluster_version, fleet_file, ids, metric_checks
from tests.support.orchestrator import ROOT


def test_plan_finishes_for_a_spec_with_health_checks(
    sim: Callable[..., Sim], tmp_path: Path
) -> None:
    fleet = sim(fleet_file(10, metrics={'error_ratio{cluster="{{cluster}}"}': 0.5}))
    spec = {
        "strategy": {
            "stages": [
                {"name": "canary", "clusters": ids(2)},
                {"name": "main", "clusters": ids(10)[2:]},
            ]
        },
        "healthChecks": metric_checks(
            'error_ratio{cluster="{{ cluster }}"}', 0.01, interval="1m", success=3, timeout="30m"
        ),
    }
    path = tmp_path / "cv.yaml"
    path.write_text(yaml.safe_dump(cluster_version("fleet", fleet.address, ids(10), 7, **spec)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "plan",
            "-f",
            str(path),
            "--step-seconds",
            "60",
            "--traffic-seconds",
            "10",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # the field report: it never finished
    )
    assert out.returncode == 0, out.stderr
    # A check is assumed to pass after successThreshold x interval: each cluster verifies for
    # 120 s (passes at 0, 60 and 120 s) before service-in, and so does the canary stage before
    # main starts. canary: 10 + 3 x 60 + 10 + 120 = 320 s per cluster, + 120 s stage checks;
    # main: 8 clusters in waves of 3 (floor 7 of 10) = 3 x 320 s. Total 1400 s.
    assert "estimated time: 0h23m20s (Succeeded)" in out.stdout, out.stdout
    assert "wave 2 at +0h07m20s: 3 cluster(s)" in out.stdout, out.stdout
    assert "lowest available in service: 7" in out.stdout, out.stdout
    m = fleet.monitor()
    assert m["mutations_total"] == 0 and m["available_in_service"] == 10, (
        m
    )  # a plan acts on nothing


def test_plan_names_the_stages_that_select_no_cluster_and_exits_non_zero(
    sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """Issue 19: a misspelt selector printed `0h00m00s (Succeeded)` with exit 0."""
    fleet = sim(fleet_file(4))
    body = cluster_version("fleet", fleet.address, [], 2)
    del body["spec"]["clusters"]
    body["spec"]["version"] = NEW
    body["spec"]["strategy"] = {
        "stages": [
            {"name": "first", "selector": {"matchLabels": {"index": "O"}}},  # letter O, not 0
            {
                "name": "rest",
                "selector": {
                    "matchExpressions": [{"key": "index", "operator": "NotIn", "values": ["0"]}]
                },
            },
            {
                "name": "late",
                "selector": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
            },
        ]
    }
    path = tmp_path / "cv.yaml"
    path.write_text(yaml.safe_dump(body))
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", "-f", str(path)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert [line.split(" selects")[0] for line in lines] == [
        "invalid: spec.strategy.stages[0]: stage 'first'",
        "invalid: spec.strategy.stages[2]: stage 'late'",
    ], out.stderr
    assert all("selects no cluster of the plugin's inventory" in line for line in lines)
    assert "estimated time" not in out.stdout and "Succeeded" not in out.stdout, out.stdout
    m = fleet.monitor()
    assert m["mutations_total"] == 0 and m["available_in_service"] == 4, m
