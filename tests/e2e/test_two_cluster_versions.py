"""Issue 11, failure 2: two ClusterVersions over the same clusters keep both floors."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.conftest import (
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import KubeCluster, wait_for


def test_two_cluster_versions_in_two_namespaces_never_break_the_floor(
    control_plane: KubeCluster,
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
) -> None:
    fleet = sim(fleet_file(12, step=0.3))
    with control_plane.temporary_namespace("second-cv") as other_ns:
        # One orchestrator watching every namespace; the admin allows inline endpoints in both.
        orchestrators.start(
            "--allow-inline-endpoints-in",
            f"{objects.ns},{other_ns}",
            all_namespaces=True,
        )
        other = Objects(control_plane, other_ns)
        try:
            objects.create_cv(cluster_version("a", fleet.address, ids(12), 9))
            other.create_cv(cluster_version("b", fleet.address, ids(12), 9))
            wait_for(
                "ClusterVersion a completes",
                lambda: objects.cv_phase_is("a", "Completed"),
                timeout=120,
                interval=0.3,
            )
            wait_for(
                "ClusterVersion b completes",
                lambda: other.cv_phase_is("b", "Completed"),
                timeout=60,
                interval=0.3,
            )
            ups_a = objects.upgrades(objects.current_run("a"))
            ups_b = other.upgrades(other.current_run("b"))
            # Read before the namespace goes (its deletion makes later reconciles fail).
            errors = reconcile_errors(orchestrators.logs())
        finally:
            other.client.close()
    m = fleet.monitor()
    # Available-and-in-service never fell below either ClusterVersion's floor.
    assert m["min_available_in_service"] >= 9, m
    assert m["clusters_at_target"] == 12 and m["available_in_service"] == 12, m
    # One owner: each cluster was upgraded by exactly one of the runs, once.
    assert m["duplicate_mutations"] == 0 and m["mutations_total"] == 12 * 5, m
    for cid in ids(12):
        phases = {ups_a[cid]["status"]["phase"], ups_b[cid]["status"]["phase"]}
        assert phases == {"Upgraded", "Skipped"}, (cid, phases)
    skipped = [u for u in [*ups_a.values(), *ups_b.values()] if u["status"]["phase"] == "Skipped"]
    assert all(u["status"]["reason"] == "AtTarget" for u in skipped)
    assert not errors
