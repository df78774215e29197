"""Issue 19, the per-run gauge: `/metrics` of the real `fleet-orchestrator run` during and after
a rollout names UpdateRuns only, each run's phases sum to its clusters at every scrape, and a
run's series (clusters per phase, health checks) go when the run is pruned or deleted."""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import api
from tests.e2e.conftest import (
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    metric_checks,
    reconcile_errors,
)
from tests.support.kube import wait_for
from tests.support.orchestrator import OrchestratorProcess

PHASES = {p.value for p in api.UpgradePhase}
GAUGE = "multicluster_controller_clusters"
#: The other series labelled by a run (namespace, name): the health check metrics.
PER_RUN = (
    "multicluster_controller_health_check_total",
    "multicluster_controller_health_check_value",
)
QUERY = 'error_ratio{cluster="{{ cluster }}"}'
ERROR_RATIO = 0.003


def clusters_gauge(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """(namespace, name) → phase → value of multicluster_controller_clusters in one scrape."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != GAUGE:
                continue
            assert set(sample.labels) == {"namespace", "name", "phase"}, sample
            phases = out.setdefault((sample.labels["namespace"], sample.labels["name"]), {})
            assert sample.labels["phase"] not in phases, f"duplicate series {sample}"
            phases[sample.labels["phase"]] = sample.value
    return out


def per_run_labels(text: str) -> set[tuple[str, str]]:
    """(namespace, name) of every health-check series in one scrape."""
    return {
        (s.labels["namespace"], s.labels["name"])
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in PER_RUN
    }


def check_scrape(
    text: str, runs: dict[tuple[str, str], int]
) -> dict[tuple[str, str], dict[str, float]]:
    """Every label set of the gauge is a run of `runs` ((namespace, name) → its cluster count),
    with every phase once, whole non-negative counts summing to the run's clusters."""
    gauge = clusters_gauge(text)
    assert set(gauge) <= set(runs), f"series of no UpdateRun: {sorted(set(gauge) - set(runs))}"
    for key, phases in gauge.items():
        assert set(phases) == PHASES, (key, phases)
        assert all(v >= 0 and v == int(v) for v in phases.values()), (key, phases)
        assert sum(phases.values()) == runs[key], (key, phases, runs[key])
    assert per_run_labels(text) <= set(runs), per_run_labels(text)
    return gauge


def metrics_of(proc: OrchestratorProcess) -> str:
    """The process's /metrics, or "" while its server is not up yet."""
    try:
        return proc.metrics()
    except OSError:
        return ""


def in_flight(phases: dict[str, float]) -> float:
    return sum(v for p, v in phases.items() if p not in {"Pending", "Upgraded", "Skipped"})


def follow_rollout(
    proc: OrchestratorProcess, objects: Objects, cv: str, run: str, n: int
) -> tuple[int, float]:
    """Scrape /metrics until the ClusterVersion completes, checking every scrape; (scrapes made,
    most clusters seen in flight at once)."""
    key = (objects.ns, run)
    scrapes, most = 0, 0.0
    deadline = time.monotonic() + 120
    while not objects.cv_phase_is(cv, "Completed"):
        assert time.monotonic() < deadline, f"{cv} did not complete: {objects.cv_status(cv)}"
        gauge = check_scrape(proc.metrics(), {key: n})
        scrapes += 1
        if key in gauge:
            most = max(most, in_flight(gauge[key]))
        time.sleep(0.1)
    return scrapes, most


def test_per_run_series_during_a_rollout_and_gone_with_the_run(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    n = 5
    fleet = sim(fleet_file(n, step=0.3, metrics={QUERY.replace(" ", ""): ERROR_RATIO}))
    proc = orchestrators.start("--run-history", "0")
    spec = cluster_version(
        "fleet",
        fleet.address,
        ids(n),
        n - 2,
        strategy={"maxConcurrency": 2},
        healthChecks=metric_checks(QUERY, 0.01, success=2),
    )
    objects.create_cv(spec)
    first = objects.current_run("fleet")
    ns = objects.ns

    # During the rollout: every scrape names this run only, and its phases sum to n.
    scrapes, most = follow_rollout(proc, objects, "fleet", first, n)
    assert scrapes >= 5 and most >= 1, (scrapes, most)  # seen mid-flight, not only at the end
    world = fleet.monitor()
    assert world["clusters_at_target"] == n and world["min_available_in_service"] >= n - 2, world
    done = check_scrape(proc.metrics(), {(ns, first): n})
    assert done == {(ns, first): {p: (n if p == "Upgraded" else 0) for p in PHASES}}, done
    assert per_run_labels(proc.metrics()) == {(ns, first)}

    # A restarted orchestrator exports the finished run again (its pass is set every time).
    proc.stop()
    proc = orchestrators.start("--run-history", "0", identity="orchestrator-e2e-restarted")
    wait_for(
        "the restarted orchestrator exports the finished run",
        lambda: check_scrape(metrics_of(proc), {(ns, first): n}) == done,
        timeout=30,
        interval=0.2,
    )

    # A new spec makes a second run; with --run-history 0 the first, finished, is pruned.
    objects.patch_cv("fleet", {"spec": {"strategy": {"maxConcurrency": 3}}})
    second = wait_for(
        "a second run",
        lambda: (r := objects.cv_status("fleet").get("currentRun")) != first and r,
        timeout=60,
    )
    wait_for(
        "the first run is pruned",
        lambda: first not in {r["metadata"]["name"] for r in objects.runs()},
        timeout=60,
    )
    wait_for(
        "the pruned run's series go",
        lambda: (
            (ns, first) not in clusters_gauge(t := proc.metrics())
            and (ns, first) not in per_run_labels(t)
        ),
        timeout=15,
        interval=0.2,
    )
    wait_for("the second run completes", lambda: objects.cv_phase_is("fleet", "Completed"), 60)
    after = check_scrape(proc.metrics(), {(ns, second): n})
    assert set(after) == {(ns, second)}, after  # the clusters are at target: Skipped or Upgraded
    assert after[(ns, second)]["Upgraded"] + after[(ns, second)]["Skipped"] == n, after

    # Deleted: the ClusterVersion first (else it makes its run again), then the run itself
    # (a garbage collector, where one runs, may have done that already).
    objects.api.delete_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, "fleet")
    try:
        objects.api.delete_namespaced_custom_object(
            api.GROUP, api.VERSION, ns, api.UPDATE_RUN_PLURAL, second
        )
    except ApiException as error:
        assert error.status == 404, error
    wait_for(
        "the deleted run is gone",
        lambda: second not in {r["metadata"]["name"] for r in objects.runs()},
        timeout=60,
    )
    wait_for(
        "the deleted run's series go",
        lambda: not clusters_gauge(t := proc.metrics()) and not per_run_labels(t),
        timeout=15,
        interval=0.2,
    )
    assert not reconcile_errors(orchestrators.logs())
