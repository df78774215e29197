"""Issue 19: deleting a rollout mid-flight brings back into service what it took out.

The real stack with the real garbage collector: the `garbage_collected` apiserver (its own, so
the collector touches no other test's objects) with a kube-controller-manager running only the
garbage collector, the real `fleet-orchestrator run` and the sim plugin. Each test deletes an
object while clusters are out of service and asserts the world: every cluster back in service,
the floor held throughout (the sim's monitor), and every object eventually gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from orchestrator import api
from tests.e2e.conftest import (
    NEW,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
    running_orchestrators,
)
from tests.support.kube import KubeCluster, wait_for

#: Seven clusters, at most two in flight, a floor of five: the floor allows exactly two out.
N, IN_FLIGHT, FLOOR = 7, 2, 5
#: Seconds per sim step: slow enough that a deletion lands while clusters are out of service.
STEP = 1.5


@pytest.fixture
def gc_objects(garbage_collected: KubeCluster, gc_namespace: str) -> Iterator[Objects]:
    o = Objects(garbage_collected, gc_namespace)
    yield o
    o.client.close()


@pytest.fixture
def gc_orchestrators(
    garbage_collected: KubeCluster, gc_namespace: str, tmp_path: Path
) -> Iterator[Orchestrators]:
    with running_orchestrators(garbage_collected, gc_namespace, tmp_path) as o:
        yield o


def out_of_service(fleet: Sim) -> list[str]:
    return [c for c in ids(N) if not fleet.cluster(c)["inService"]]


def delete(objects: Objects, plural: str, name: str, propagation: str) -> None:
    objects.api.delete_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        objects.ns,
        plural,
        name,
        body=k8s.V1DeleteOptions(propagation_policy=propagation),
    )


def left(objects: Objects) -> dict[str, list[str]]:
    """Names of our objects still in the namespace, by plural (empty lists: all gone)."""
    out = {}
    for plural in (api.PLURAL, api.UPDATE_RUN_PLURAL, api.CLUSTER_UPGRADE_PLURAL):
        items = objects.api.list_namespaced_custom_object(
            api.GROUP, api.VERSION, objects.ns, plural
        )["items"]
        out[plural] = [o["metadata"]["name"] for o in items]
    return out


def gone(objects: Objects) -> bool:
    return not any(left(objects).values())


def start_rollout(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators, body: Any = None
) -> tuple[Sim, list[str]]:
    """A rollout of N clusters; returns once IN_FLIGHT of them are out of service."""
    fleet = sim(fleet_file(N, step=STEP))
    orchestrators.start()
    if body is None:
        strategy = {"maxConcurrency": IN_FLIGHT}
        objects.create_cv(cluster_version("fleet", fleet.address, ids(N), FLOOR, strategy=strategy))
    else:
        objects.api.create_namespaced_custom_object(
            api.GROUP, api.VERSION, objects.ns, api.UPDATE_RUN_PLURAL, body(fleet.address)
        )
    out = wait_for(
        f"{IN_FLIGHT} clusters out of service",
        lambda: o if len(o := out_of_service(fleet)) == IN_FLIGHT else None,
        timeout=90,
        interval=0.05,
    )
    return fleet, list(out)


def assert_all_back(fleet: Sim, objects: Objects, orchestrators: Orchestrators) -> None:
    wait_for("every object gone", lambda: gone(objects), timeout=120, interval=0.5)
    m = fleet.monitor()
    assert m["operations_in_flight"] == 0, m
    for cid in ids(N):
        state = fleet.cluster(cid)
        assert state["inService"] and state["available"], state
    assert m["min_available_in_service"] >= FLOOR, m
    assert m["duplicate_mutations"] == 0, m
    assert not reconcile_errors(orchestrators.logs())


@pytest.mark.parametrize("propagation", ["Background", "Foreground"])
def test_deleting_a_cluster_version_mid_rollout_brings_its_clusters_back(
    propagation: str,
    sim: Callable[..., Sim],
    gc_objects: Objects,
    gc_orchestrators: Orchestrators,
) -> None:
    fleet, out = start_rollout(sim, gc_objects, gc_orchestrators)
    run = gc_objects.current_run("fleet")
    for o in (gc_objects.cv("fleet"), gc_objects.run(run), *gc_objects.upgrades(run).values()):
        assert api.FINALIZER in o["metadata"].get("finalizers", []), o["metadata"]
    delete(gc_objects, api.PLURAL, "fleet", propagation)
    # Held while its clusters come back: the run says so.
    deleting = wait_for(
        "the run says it is being deleted",
        lambda: next(
            (
                c
                for c in (gc_objects.run(run).get("status") or {}).get("conditions") or []
                if c["type"] == "Deleting"
            ),
            None,
        ),
        timeout=30,
    )
    assert deleting["status"] == "True", deleting
    assert_all_back(fleet, gc_objects, gc_orchestrators)
    for cid in out:  # the clusters out at the moment of deletion came back
        assert fleet.cluster(cid)["inService"], cid


def test_deleting_an_update_run_directly_brings_its_clusters_back(
    sim: Callable[..., Sim], gc_objects: Objects, gc_orchestrators: Orchestrators
) -> None:
    fleet, out = start_rollout(sim, gc_objects, gc_orchestrators, one_shot)
    delete(gc_objects, api.UPDATE_RUN_PLURAL, "one-shot", "Background")
    assert_all_back(fleet, gc_objects, gc_orchestrators)
    for cid in out:
        assert fleet.cluster(cid)["inService"], cid


def test_deleting_a_cluster_upgrade_alone_skips_its_cluster_and_it_goes_with_the_run(
    sim: Callable[..., Sim], gc_objects: Objects, gc_orchestrators: Orchestrators
) -> None:
    fleet, _ = start_rollout(sim, gc_objects, gc_orchestrators)
    run = gc_objects.current_run("fleet")
    pending = ids(N)[-1]  # started last (clusters start in id order): not started yet
    assert (gc_objects.upgrade_status(run, pending).get("phase") or "Pending") == "Pending"
    name = gc_objects.upgrades(run)[pending]["metadata"]["name"]
    delete(gc_objects, api.CLUSTER_UPGRADE_PLURAL, name, "Background")
    status = wait_for(
        "the run ends",
        lambda: gc_objects.run_phase_is(run, "Succeeded", "Failed", "Halted"),
        timeout=120,
        interval=0.5,
    )
    assert status["phase"] == "Succeeded", status
    wait_for(
        "the deleted ClusterUpgrade goes once its run ended",
        lambda: pending not in gc_objects.upgrades(run),
        timeout=30,
    )
    assert fleet.cluster(pending)["controlPlaneVersion"] != NEW  # skipped, never touched
    m = fleet.monitor()
    assert all(fleet.cluster(c)["inService"] for c in ids(N)), m
    assert m["min_available_in_service"] >= FLOOR, m
    # The ended run, looked at again (a spec edit), counts what is left instead of waiting
    # for the deleted ClusterUpgrade to come back.
    gc_objects.patch_cv(
        "fleet", {"spec": {"retry": {"clusters": ["cluster-00"], "round": 1, "reason": "t"}}}
    )

    def looked_at_again() -> dict[str, Any] | None:
        obj = gc_objects.run(run)
        st = obj.get("status") or {}
        handed = (obj["spec"].get("retry") or {}).get("round") == 1  # the edit reached it
        seen = st.get("observedGeneration") == obj["metadata"]["generation"]
        return st if handed and seen else None

    status = wait_for("the run looked at again", looked_at_again, timeout=30)
    assert status["phase"] == "Succeeded" and status["counts"]["total"] == N - 1, status
    delete(gc_objects, api.PLURAL, "fleet", "Background")
    wait_for("every object gone", lambda: gone(gc_objects), timeout=60, interval=0.5)


def one_shot(endpoint: str, n: int = N) -> dict[str, Any]:
    """An UpdateRun applied directly (no ClusterVersion)."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.UPDATE_RUN_KIND,
        "metadata": {"name": "one-shot"},
        "spec": {
            "requiredAvailableCount": FLOOR if n == N else n - 1,
            "opsEndpoint": {"endpoint": endpoint, "insecure": True},
            "clusters": [{"id": c, "version": NEW} for c in ids(n)],
            "strategy": {"maxConcurrency": IN_FLIGHT},
        },
    }


def test_a_finished_run_goes_at_once(
    sim: Callable[..., Sim], gc_objects: Objects, gc_orchestrators: Orchestrators
) -> None:
    """Nothing of a finished run is out of service: its finalizers go at once (history pruning
    relies on this), in foreground deletion too."""
    fleet = sim(fleet_file(3, step=0.1))
    gc_orchestrators.start()
    gc_objects.api.create_namespaced_custom_object(
        api.GROUP, api.VERSION, gc_objects.ns, api.UPDATE_RUN_PLURAL, one_shot(fleet.address, 3)
    )
    wait_for("the run ends", lambda: gc_objects.run_phase_is("one-shot", "Succeeded"), timeout=60)
    assert all(
        api.FINALIZER in o["metadata"].get("finalizers", [])
        for o in (gc_objects.run("one-shot"), *gc_objects.upgrades("one-shot").values())
    )
    delete(gc_objects, api.UPDATE_RUN_PLURAL, "one-shot", "Foreground")
    wait_for("the finished run and its ClusterUpgrades go", lambda: gone(gc_objects), timeout=20)


def test_a_failed_cluster_kept_out_by_policy_is_said_and_the_rest_come_back(
    sim: Callable[..., Sim], gc_objects: Objects, gc_orchestrators: Orchestrators
) -> None:
    """failedClusterPolicy KeepOut (the default): a cluster that failed out of service stays
    out, visibly (a Warning Event on the run, naming it); the run goes, the others come back."""
    fail = {"failStep": [{"step": "controlPlane", "clusters": ["cluster-00"]}]}
    fleet = sim(fleet_file(N, step=STEP, faults=fail))
    gc_orchestrators.start()
    strategy = {"maxConcurrency": IN_FLIGHT, "maxFailures": 3}
    gc_objects.create_cv(
        cluster_version("fleet", fleet.address, ids(N), FLOOR - 1, strategy=strategy)
    )
    run = gc_objects.current_run("fleet")
    wait_for(
        "cluster-00 failed out of service while others are in flight",
        lambda: (
            gc_objects.upgrade_status(run, "cluster-00").get("phase") == "Failed"
            and len(out_of_service(fleet)) == IN_FLIGHT
        ),
        timeout=90,
    )
    delete(gc_objects, api.PLURAL, "fleet", "Background")
    wait_for("every object gone", lambda: gone(gc_objects), timeout=120, interval=0.5)
    assert not fleet.cluster("cluster-00")["inService"]  # kept out, as the policy says
    for cid in ids(N)[1:]:
        state = fleet.cluster(cid)
        assert state["inService"] and state["available"], state
    m = fleet.monitor()
    assert m["operations_in_flight"] == 0 and m["duplicate_mutations"] == 0, m
    assert m["min_available_in_service"] >= FLOOR - 1, m
    said = [e for e in gc_objects.events() if e.reason == "DeletedWithClustersKeptOut"]
    assert len(said) == 1 and said[0].type == "Warning", said
    assert said[0].involved_object.name == run, said
    assert "cluster-00" in said[0].message and "KeepOut" in said[0].message, said
    assert "DeletedWithClustersKeptOut" in gc_orchestrators.logs()  # and in the log


def test_history_pruning_still_removes_finished_runs_promptly(
    sim: Callable[..., Sim], gc_objects: Objects, gc_orchestrators: Orchestrators
) -> None:
    """`_prune` deletes finished runs beyond --run-history: their finalizers go at once."""
    fleet = sim(fleet_file(3, step=0.1))
    gc_orchestrators.start("--run-history", "0")
    gc_objects.create_cv(cluster_version("fleet", fleet.address, ids(3), 2))
    first = gc_objects.current_run("fleet")
    wait_for("the first run ends", lambda: gc_objects.run_phase_is(first, "Succeeded"), timeout=60)
    gc_objects.patch_cv("fleet", {"spec": {"strategy": {"maxConcurrency": 2}}})
    second = wait_for(
        "a second run",
        lambda: (r := gc_objects.cv_status("fleet").get("currentRun")) != first and r,
        timeout=30,
    )
    wait_for(
        "the second run ends",
        lambda: gc_objects.run_phase_is(second, "Succeeded"),
        timeout=60,
    )
    wait_for(
        "the first run and its ClusterUpgrades are pruned",
        lambda: (
            left(gc_objects)[api.UPDATE_RUN_PLURAL] == [second] and not gc_objects.upgrades(first)
        ),
        timeout=15,
    )
    assert len(gc_objects.upgrades(second)) == 3


def test_orphan_deletion_lets_the_cluster_version_go_and_its_run_carries_on(
    sim: Callable[..., Sim], gc_objects: Objects, gc_orchestrators: Orchestrators
) -> None:
    """`--cascade=orphan`: the ClusterVersion goes at once; its run, unowned, finishes."""
    fleet, _ = start_rollout(sim, gc_objects, gc_orchestrators)
    run = gc_objects.current_run("fleet")
    delete(gc_objects, api.PLURAL, "fleet", "Orphan")
    wait_for(
        "the ClusterVersion goes, its run stays",
        lambda: left(gc_objects)[api.PLURAL] == [] and left(gc_objects)[api.UPDATE_RUN_PLURAL],
        timeout=30,
    )
    assert not gc_objects.run(run)["metadata"].get("ownerReferences")
    status = wait_for(
        "the orphaned run ends",
        lambda: gc_objects.run_phase_is(run, "Succeeded", "Failed", "Halted", "Stopped"),
        timeout=120,
        interval=0.5,
    )
    assert status["phase"] == "Succeeded", status
    assert fleet.monitor()["clusters_at_target"] == N
    assert fleet.monitor()["min_available_in_service"] >= FLOOR
    delete(gc_objects, api.UPDATE_RUN_PLURAL, run, "Background")
    wait_for("every object gone", lambda: gone(gc_objects), timeout=30, interval=0.5)
