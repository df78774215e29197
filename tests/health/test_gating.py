"""Health gating end to end: real Prometheus scraping a real app, the sim plugin, the controller."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controllers.test_rollout import NEW, cluster_version, fleet
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import CV, OrchestratorProcess, free_port, monitor, simulated_fleet
from tests.support.prometheus import SampleApp, prometheus_binary, running_prometheus

pytestmark = pytest.mark.skipif(
    prometheus_binary() is None and os.environ.get("CI") != "true",
    reason="prometheus not installed (apt-get install prometheus); CI installs it",
)

RATIO = 'request_success_ratio{cluster="{{ cluster }}"}'


@pytest.fixture
def app() -> Iterator[SampleApp]:
    sample = SampleApp()
    for i in range(4):
        sample.set(f"cluster-{i:02d}", 0.99)
    sample.start()
    yield sample
    sample.stop()


@pytest.fixture
def prometheus(tmp_path: Path, app: SampleApp) -> Iterator[str]:
    with running_prometheus(tmp_path, [f"127.0.0.1:{app.port}"]) as url:
        yield url


@pytest.fixture
def orchestrator(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> Iterator[OrchestratorProcess]:
    proc = OrchestratorProcess(control_plane.kubeconfig, namespace, tmp_path / "orchestrator.log")
    yield proc.start()
    proc.stop()


def checks(*items: dict[str, Any], success: int = 3, failure: int = 2) -> dict[str, Any]:
    return {
        "interval": "1s",
        "successThreshold": success,
        "failureThreshold": failure,
        "timeout": "2m",
        "checks": list(items),
    }


def prom_check(url: str, name: str = "success-ratio") -> dict[str, Any]:
    return {
        "name": name,
        "metric": {
            "provider": {"type": "prometheus", "address": url},
            "query": RATIO,
            "thresholdRange": {"min": 0.95},
        },
    }


def counter(text: str, run: str, check: str, result: str) -> float:
    """A health-check counter of one UpdateRun (the metrics are labelled by run)."""
    pattern = (
        rf'multicluster_controller_health_check_total\{{check="{re.escape(check)}",'
        rf'name="{re.escape(run)}",namespace="[^"]+",result="{result}"\}} ([0-9.e+]+)'
    )
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def test_healthy_app_proceeds_after_exactly_success_threshold_passes(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    prometheus: str,
    orchestrator: OrchestratorProcess,
) -> None:
    with simulated_fleet(tmp_path, fleet(3), NEW) as sim:
        cvs = CV(control_plane, namespace)
        ids = [f"cluster-{i:02d}" for i in range(3)]
        cvs.create(
            cluster_version(
                "fleet", sim.address, ids, 2, healthChecks=checks(prom_check(prometheus))
            )
        )
        wait_for(
            "rollout completes",
            lambda: cvs.phase_is("fleet", "Completed"),
            timeout=120,
            interval=0.2,
        )
        text = orchestrator.metrics()
        run = cvs.status("fleet")["currentRun"]
        # successThreshold per cluster
        assert counter(text, run, "success-ratio", "passed") == 3 * 3
        assert counter(text, run, "success-ratio", "failed") == 0
        assert 'multicluster_controller_health_check_value{check="success-ratio"' in text
        assert monitor(sim)["clusters_at_target"] == 3
        for cid, up in cvs.upgrades("fleet").items():  # the health state stays on each cluster
            health = up["status"]["health"]
            assert up["status"]["phase"] == "Upgraded", cid
            assert health["passes"] == 3 and health["failures"] == 0, (cid, health)


def test_unhealthy_after_upgrade_halts_at_that_cluster(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    app: SampleApp,
    prometheus: str,
    orchestrator: OrchestratorProcess,
) -> None:
    with simulated_fleet(tmp_path, fleet(3), NEW) as sim:
        cvs = CV(control_plane, namespace)
        ids = [f"cluster-{i:02d}" for i in range(3)]
        cvs.create(
            cluster_version(
                "fleet", sim.address, ids, 2, healthChecks=checks(prom_check(prometheus))
            )
        )
        wait_for(
            "cluster-00's control plane upgraded",
            lambda: monitor(sim)["clusters_by_version"].get(NEW, 0) >= 1,
            timeout=60,
            interval=0.02,
        )
        app.set("cluster-00", 0.42)
        wait_for("rollout halts", lambda: cvs.phase_is("fleet", "Halted"), timeout=90, interval=0.2)
        failed = cvs.failed("fleet")
        assert list(failed) == ["cluster-00"]
        assert failed["cluster-00"]["reason"] == "HealthCheckFailed"
        message = failed["cluster-00"]["message"]
        assert "success-ratio" in message
        assert "0.42" in message and "[0.95, ∞]" in message
        assert failed["cluster-00"]["health"]["failures"] == 2  # failureThreshold
        m = monitor(sim)
        assert m["mutations_total"] == 4  # serviceOut, control plane, two pools; no serviceIn
        assert m["available_in_service"] == 2  # cluster-00 stays out of service


def test_prometheus_down_counts_as_failure_with_a_reason(
    control_plane: KubeCluster, namespace: str, tmp_path: Path, orchestrator: OrchestratorProcess
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with simulated_fleet(tmp_path, fleet(2), NEW) as sim:
        cvs = CV(control_plane, namespace)
        cvs.create(
            cluster_version(
                "fleet",
                sim.address,
                ["cluster-00", "cluster-01"],
                1,
                healthChecks=checks(prom_check(closed)),
            )
        )
        wait_for("rollout halts", lambda: cvs.phase_is("fleet", "Halted"), timeout=90, interval=0.2)
        failed = cvs.failed("fleet")
        assert len(failed) == 1
        (entry,) = failed.values()
        assert entry["reason"] == "HealthCheckFailed"
        assert f"Prometheus {closed}: unreachable" in entry["message"], entry
        assert orchestrator.proc is not None and orchestrator.proc.poll() is None
        assert monitor(sim)["mutations_total"] == 4


def test_two_providers_both_required(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    prometheus: str,
    orchestrator: OrchestratorProcess,
) -> None:
    spec = fleet(2)
    spec["clusters"][0]["metrics"] = {"error_rate": 0.001}
    spec["clusters"][1]["metrics"] = {"error_rate": 0.2}
    plugin_check = {
        "name": "error-rate",
        "metric": {
            "provider": {"type": "plugin"},
            "query": "error_rate",
            "thresholdRange": {"max": 0.01},
        },
    }
    with simulated_fleet(tmp_path, spec, NEW) as sim:
        cvs = CV(control_plane, namespace)
        cvs.create(
            cluster_version(
                "fleet",
                sim.address,
                ["cluster-00", "cluster-01"],
                1,
                healthChecks=checks(prom_check(prometheus), plugin_check),
            )
        )
        status = wait_for(
            "rollout halts", lambda: cvs.phase_is("fleet", "Halted"), timeout=120, interval=0.2
        )
        failed = cvs.failed("fleet")
        assert list(failed) == ["cluster-01"]
        message = failed["cluster-01"]["message"]
        assert "error-rate" in message and "0.2" in message
        text = orchestrator.metrics()
        run = status["currentRun"]
        assert counter(text, run, "success-ratio", "passed") >= 3  # cluster-00 passed both
        assert counter(text, run, "error-rate", "passed") == 3
        assert counter(text, run, "error-rate", "failed") == 2


def test_bad_health_checks_are_invalid_before_any_mutation(
    control_plane: KubeCluster, namespace: str, tmp_path: Path, orchestrator: OrchestratorProcess
) -> None:
    bad = [
        {
            "name": "a",
            "metric": {
                "provider": {"type": "prometheus", "address": "http://p:9090"},
                "query": "sum(rate(x[5m]",
                "thresholdRange": {"min": 1},
            },
        },
        {
            "name": "b",
            "metric": {
                "provider": {"type": "prometheus", "address": "http://p:9090"},
                "query": "up",
                "thresholdRange": {},
            },
        },
        {
            "name": "c",
            "metric": {"provider": {"type": "statsd"}, "query": "up", "thresholdRange": {"max": 1}},
        },
    ]
    with simulated_fleet(tmp_path, fleet(2), NEW) as sim:
        cvs = CV(control_plane, namespace)
        cvs.create(
            cluster_version(
                "fleet", sim.address, ["cluster-00", "cluster-01"], 1, healthChecks=checks(*bad)
            )
        )
        status = wait_for("marked invalid", lambda: cvs.phase_is("fleet", "Invalid"), timeout=30)
        message = next(c for c in status["conditions"] if c["type"] == "Ready")["message"]
        assert "spec.healthChecks.checks[0].metric.query" in message
        assert "spec.healthChecks.checks[1].metric.thresholdRange" in message
        assert "spec.healthChecks.checks[2].metric.provider.type" in message
        assert monitor(sim)["mutations_total"] == 0
