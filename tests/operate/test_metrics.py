"""The series labelled by an UpdateRun are bounded by the runs that exist, and a scrape never
sees a run's clusters half-updated."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.adapters.metrics import Metrics

PHASES = ("Pending", "ServicingOut", "Upgraded")


def series(m: Metrics) -> dict[str, set[tuple[str, ...]]]:
    """Sample name → label values (namespace, name, then the others by label name), as a
    scrape shows them."""
    out: dict[str, set[tuple[str, ...]]] = {}
    text = generate_latest(m.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            head = tuple(labels.pop(k) for k in ("namespace", "name") if k in labels)
            out.setdefault(s.name, set()).add(head + tuple(v for _, v in sorted(labels.items())))
    return out


def record(m: Metrics, ns: str, run: str) -> None:
    m.clusters.put(ns, run, {"Pending": 1, "ServicingOut": 1, "Upgraded": 2})
    m.of_run(m.health_checks, ns, run, "error-ratio", "passed").inc()
    m.of_run(m.health_value, ns, run, "error-ratio").set(0.5)


def runs_in(m: Metrics) -> set[tuple[str, str]]:
    found = series(m)
    return {
        labels[:2]
        for name in (
            "multicluster_controller_clusters",
            "multicluster_controller_health_check_total",
            "multicluster_controller_health_check_value",
        )
        for labels in found.get(name, set())
    }


def test_forget_run_removes_every_series_of_that_run_only() -> None:
    m = Metrics()
    record(m, "team-a", "fleet-1")
    record(m, "team-a", "fleet-2")
    record(m, "team-b", "fleet-1")
    assert runs_in(m) == {("team-a", "fleet-1"), ("team-a", "fleet-2"), ("team-b", "fleet-1")}
    m.forget_run("team-a", "fleet-1")
    assert runs_in(m) == {("team-a", "fleet-2"), ("team-b", "fleet-1")}
    clusters = series(m)["multicluster_controller_clusters"]
    assert clusters == {("team-a", "fleet-2", p) for p in PHASES} | {
        ("team-b", "fleet-1", p) for p in PHASES
    }
    m.forget_run("team-a", "fleet-1")  # again: nothing left to remove, no error
    # A run recorded again after being forgotten is exported again (a run re-created).
    record(m, "team-a", "fleet-1")
    assert ("team-a", "fleet-1") in runs_in(m)


def test_keep_runs_drops_the_runs_that_no_longer_exist() -> None:
    m = Metrics()
    for run in ("a", "b", "c"):
        record(m, "ns", run)
    m.keep_runs({("ns", "b"), ("ns", "never-seen")})
    assert runs_in(m) == {("ns", "b")}
    m.keep_runs(())  # no run exists any more
    assert runs_in(m) == set()
    # The other metrics are untouched.
    assert "multicluster_controller_reconcile_duration_seconds_count" in series(m)


def test_a_scrape_sees_each_run_whole() -> None:
    """A writer moves clusters between phases while scrapes run: every scrape sums to 10."""
    m = Metrics()
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i = (i + 1) % 11
            m.clusters.put("ns", "run", {"Pending": 10 - i, "ServicingOut": 0, "Upgraded": i})

    m.clusters.put("ns", "run", {"Pending": 10, "ServicingOut": 0, "Upgraded": 0})
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(300):
            text = generate_latest(m.registry).decode()
            total = sum(
                s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "multicluster_controller_clusters"
            )
            assert total == 10, text
    finally:
        stop.set()
        thread.join()
