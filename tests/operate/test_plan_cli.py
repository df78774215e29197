"""`fleet-orchestrator plan`: prints stages, waves and an estimate; changes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.controllers.test_rollout import NEW, cluster_version, fleet
from tests.support.orchestrator import ROOT, monitor, simulated_fleet


def run_plan(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", "-f", str(path), *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_plan_prints_waves_under_the_budget_and_mutates_nothing(tmp_path: Path) -> None:
    with simulated_fleet(tmp_path, fleet(10), NEW) as sim:
        body = cluster_version(
            "fleet",
            sim.address,
            [f"cluster-{i:02d}" for i in range(10)],
            7,
            strategy={
                "stages": [
                    {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}},
                    {
                        "name": "main",
                        "selector": {"matchLabels": {"stage": "main"}},
                        "soakTime": "10m",
                    },
                ]
            },
        )
        path = tmp_path / "cv.yaml"
        path.write_text(yaml.safe_dump(body))
        out = run_plan(path, "--step-seconds", "60", "--traffic-seconds", "10")
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert "stage canary: 2 cluster(s)" in text and "stage main: 8 cluster(s)" in text
        waves = re.findall(r"wave \d+ at \+\S+: (\d+) cluster", text)
        # canary: 2 at once (budget 3); main: 8 clusters in waves of at most 3
        assert [int(w) for w in waves] == [2, 3, 3, 2]
        assert "lowest available in service: 7" in text
        # per cluster 10 + 60 + 60 + 60 + 10 = 200 s; 4 waves = 800 s (no soak after the last stage)
        assert "estimated time: 0h13m20s" in text
        assert monitor(sim)["mutations_total"] == 0


def test_plan_finishes_for_a_spec_with_health_checks(tmp_path: Path) -> None:
    checks = {
        "interval": "30s",
        "successThreshold": 3,
        "failureThreshold": 2,
        "timeout": "10m",
        "checks": [
            {
                "name": "ratio",
                "metric": {
                    # Never queried: the what-if assumes every evaluation passes.
                    "provider": {"type": "prometheus", "address": "http://127.0.0.1:1"},
                    "query": 'up{cluster="{{ cluster }}"}',
                    "thresholdRange": {"min": 1},
                },
            }
        ],
    }
    with simulated_fleet(tmp_path, fleet(10), NEW) as sim:
        body = cluster_version(
            "fleet",
            sim.address,
            [f"cluster-{i:02d}" for i in range(10)],
            7,
            healthChecks=checks,
            strategy={
                "stages": [
                    {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}},
                    {
                        "name": "main",
                        "selector": {"matchLabels": {"stage": "main"}},
                        "soakTime": "10m",
                    },
                ]
            },
        )
        path = tmp_path / "cv.yaml"
        path.write_text(yaml.safe_dump(body))
        out = run_plan(path, "--step-seconds", "60", "--traffic-seconds", "10")
        assert out.returncode == 0, out.stderr
        text = out.stdout
        waves = re.findall(r"wave \d+ at \+(\S+): (\d+) cluster", text)
        # A cluster: 10 + 60 + 60 + 60 s, then 3 passes 30 s apart (first at once: +60 s),
        # then 10 s service-in = 260 s. The canary stage's boundary checks add 60 s more
        # (320 s); main's soak and checks do not apply after the last stage.
        assert waves == [
            ("0h00m00s", "2"),
            ("0h05m20s", "3"),
            ("0h09m40s", "3"),
            ("0h14m00s", "2"),
        ]
        assert "lowest available in service: 7" in text
        assert "estimated time: 0h18m20s (Succeeded)" in text
        assert monitor(sim)["mutations_total"] == 0


def test_plan_rejects_an_invalid_file_naming_the_field(tmp_path: Path) -> None:
    body = cluster_version("fleet", "127.0.0.1:1", ["a", "a"], 1)
    path = tmp_path / "cv.yaml"
    path.write_text(yaml.safe_dump(body))
    out = run_plan(path)
    assert out.returncode == 2
    assert "spec.clusters" in out.stderr and "listed twice" in out.stderr


def _renamed(body: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A sim fleet file whose cluster ids start with prefix (two fleets, distinct ids)."""
    for c in body["clusters"]:
        c["id"] = f"{prefix}-{c['id']}"
    return body


def _multi_spec(ids: list[str], required: int, **spec: Any) -> dict[str, Any]:
    body = cluster_version("fleet", "127.0.0.1:1", ids, required, **spec)
    del body["spec"]["opsEndpoint"]
    body["spec"]["providerRefs"] = [{"name": "gke-prod"}, {"name": "eks-prod"}]
    return body


def test_plan_over_several_providers_plans_one_floor_across_them(tmp_path: Path) -> None:
    """spec.providerRefs: one inventory per FleetProvider (--endpoint NAME=HOST:PORT each),
    one floor across both, stages selecting by the provider label the run adds."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        simulated_fleet(tmp_path / "a", _renamed(fleet(4), "gke"), NEW) as gke,
        simulated_fleet(tmp_path / "b", _renamed(fleet(4), "eks"), NEW) as eks,
    ):
        ids = [f"{p}-cluster-{i:02d}" for p in ("gke", "eks") for i in range(4)]
        body = _multi_spec(
            ids,
            6,
            strategy={
                "stages": [
                    {
                        "name": "gke",
                        "selector": {"matchLabels": {"multicluster-ops.io/provider": "gke-prod"}},
                    },
                    {
                        "name": "eks",
                        "selector": {"matchLabels": {"multicluster-ops.io/provider": "eks-prod"}},
                    },
                ]
            },
        )
        path = tmp_path / "cv.yaml"
        path.write_text(yaml.safe_dump(body))
        out = run_plan(
            path,
            "--endpoint",
            f"gke-prod={gke.address}",
            "--endpoint",
            f"eks-prod={eks.address}",
            "--step-seconds",
            "60",
            "--traffic-seconds",
            "10",
        )
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert "stage gke: 4 cluster(s)" in text and "stage eks: 4 cluster(s)" in text
        waves = re.findall(r"wave \d+ at \+\S+: (\d+) cluster\(s\): (.*)", text)
        # Budget 2 of 8 across both providers: two waves per stage, gke's clusters first.
        assert [int(n) for n, _ in waves] == [2, 2, 2, 2]
        assert all("gke-" in names for _, names in waves[:2])
        assert all("eks-" in names for _, names in waves[2:])
        assert "lowest available in service: 6" in text
        assert "estimated time: 0h13m20s (Succeeded)" in text
        assert monitor(gke)["mutations_total"] == 0 and monitor(eks)["mutations_total"] == 0


def test_plan_over_several_providers_names_the_endpoints_it_lacks(tmp_path: Path) -> None:
    body = _multi_spec(["a", "b"], 1)
    path = tmp_path / "cv.yaml"
    path.write_text(yaml.safe_dump(body))
    out = run_plan(path, "--endpoint", "gke-prod=127.0.0.1:1", "--endpoint", "aks=127.0.0.1:2")
    assert out.returncode == 2
    assert "spec.providerRefs" in out.stderr and "--endpoint NAME=HOST:PORT" in out.stderr
    assert "missing: eks-prod" in out.stderr and "not in spec.providerRefs: aks" in out.stderr
    out = run_plan(path)
    assert out.returncode == 2 and "missing: gke-prod, eks-prod" in out.stderr


def test_plan_over_several_providers_refuses_an_id_two_of_them_report(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        simulated_fleet(tmp_path / "a", fleet(2), NEW) as one,
        simulated_fleet(tmp_path / "b", fleet(2), NEW) as two,
    ):
        path = tmp_path / "cv.yaml"
        path.write_text(yaml.safe_dump(_multi_spec(["cluster-00", "cluster-01"], 1)))
        out = run_plan(
            path, "--endpoint", f"gke-prod={one.address}", "--endpoint", f"eks-prod={two.address}"
        )
        assert out.returncode == 2
        assert "cluster id cluster-00 is reported by both FleetProvider" in out.stderr
