"""Issue 12 item 4 on the real stack (apiserver, sim plugin over gRPC, `fleet-orchestrator run`,
a real HTTP receiver on loopback): a failing pre-hook leaves its cluster in service and Failed; a
Job hook whose Job the test completes in the job controller's place (no kubelet or
controller-manager here); an HTTP post-hook received exactly once per attempt, across a restart
of the orchestrator in the middle of it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

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
from tests.hooks.receiver import Receiver, serve
from tests.support.kube import KubeCluster, wait_for


def _untouched(fleet: Sim, cid: str) -> None:
    """The sim's world: the cluster never left service and was never upgraded."""
    state = fleet.cluster(cid)
    assert state["inService"] is True and state["available"] is True, state
    assert state["controlPlaneVersion"] == OLD, state
    assert {p["version"] for p in state["nodePools"]} == {OLD}, state


def test_a_failing_pre_hook_leaves_the_cluster_in_service_and_failed(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(3, step=0.2))
    with serve(Receiver()) as rcv:
        refuse = {"cluster-01"}

        def answer() -> tuple[int, str, float]:
            last = rcv.received[-1].body
            if last["cluster"] in refuse:
                return (409, '{"error": "change freeze on cluster-01 until Friday"}', 0.0)
            return (200, "ok", 0.0)

        rcv._answer = answer  # type: ignore[method-assign]
        orchestrators.start()
        objects.create_cv(
            cluster_version(
                "fleet",
                fleet.address,
                ids(3),
                2,
                strategy={
                    "maxConcurrency": 1,
                    "onFailure": "Continue",
                    "hooks": {"preUpgrade": {"http": {"url": rcv.url}, "timeout": "1m"}},
                },
            )
        )
        run = objects.current_run("fleet")
        wait_for(
            "the run finishes",
            lambda: objects.run(run).get("status", {}).get("phase") in ("Failed", "Succeeded"),
            timeout=90,
            interval=0.2,
        )
        received = list(rcv.received)
    failed = objects.upgrade_status(run, "cluster-01")
    assert failed["phase"] == "Failed" and failed["reason"] == "PreUpgradeHookFailed", failed
    # The code and fixed words only: what the receiver said goes to the orchestrator's log.
    assert "request rejected (HTTP 409)" in failed["message"], failed
    assert "change freeze" not in json.dumps(failed)
    assert "change freeze on cluster-01" in orchestrators.logs()
    assert rcv.url not in failed["message"]
    assert failed["hook"]["kind"] == "preUpgrade" and failed["hook"]["phase"] == "Failed"
    _untouched(fleet, "cluster-01")
    for cid in ("cluster-00", "cluster-02"):
        assert objects.upgrade_status(run, cid)["phase"] == "Upgraded"
        assert fleet.cluster(cid)["controlPlaneVersion"] == NEW
    assert sorted(r.body["cluster"] for r in received) == ids(3)  # one call per cluster
    m = fleet.monitor()
    assert m["mutations_total"] == 2 * 5 and m["duplicate_mutations"] == 0, m
    assert m["min_available_in_service"] >= 2, m
    assert not reconcile_errors(orchestrators.logs())


def _job_template() -> dict[str, Any]:
    return {
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "check", "image": "busybox", "command": ["true"]}],
            }
        },
    }


def test_a_job_hook_completed_by_its_job_status_lets_the_cluster_go_on(
    control_plane: KubeCluster,
    namespace: str,
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
) -> None:
    batch = k8s.BatchV1Api(objects.client)
    fleet = sim(fleet_file(2, step=0.2))
    orchestrators.start()
    objects.create_cv(
        cluster_version(
            "fleet",
            fleet.address,
            ids(2),
            1,
            strategy={"hooks": {"preUpgrade": {"job": {"template": _job_template()}}}},
        )
    )
    run = objects.current_run("fleet")
    first = wait_for(
        "the first hook Job",
        lambda: batch.list_namespaced_job(namespace).items,
        timeout=60,
    )
    assert len(first) == 1
    job = first[0]
    cid = next(e.value for e in job.spec.template.spec.containers[0].env if e.name == "CLUSTER_ID")
    owner = job.metadata.owner_references[0]
    assert owner.kind == "ClusterUpgrade"
    assert owner.uid == objects.upgrades(run)[cid]["metadata"]["uid"]
    status = objects.upgrade_status(run, cid)
    assert status["phase"] == "PreUpgradeHook" and status["hook"]["id"] == job.metadata.name
    time.sleep(1.0)  # the hook holds the cluster: nothing is drained while its Job runs
    assert fleet.cluster(cid)["inService"] is True
    assert fleet.monitor()["mutations_total"] == 0
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def complete(name: str) -> None:
        cond = {"type": "Complete", "status": "True", "lastTransitionTime": now}
        body = {"status": {"conditions": [cond], "succeeded": 1, "startTime": now}}
        batch.patch_namespaced_job_status(name, namespace, body)

    complete(job.metadata.name)
    second = wait_for(
        "the second cluster's Job (one cluster at a time: the floor is 1 of 2)",
        lambda: [
            j
            for j in batch.list_namespaced_job(namespace).items
            if j.metadata.name != job.metadata.name
        ],
        timeout=60,
    )
    assert objects.upgrade_status(run, cid)["phase"] == "Upgraded"
    complete(second[0].metadata.name)
    wait_for(
        "the rollout completes",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=60,
        interval=0.2,
    )
    assert len(batch.list_namespaced_job(namespace).items) == 2  # one Job per cluster, never more
    assert all(objects.upgrade_status(run, c)["hook"]["phase"] == "Succeeded" for c in ids(2))
    m = fleet.monitor()
    assert m["clusters_at_target"] == 2 and m["min_available_in_service"] >= 1, m
    assert not reconcile_errors(orchestrators.logs())


def test_an_http_post_hook_is_received_once_per_attempt_across_a_restart(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(2, step=0.2))
    out_of_service_at_call: list[bool] = []
    with serve(Receiver()) as rcv:
        slow = {"first": True}

        def answer() -> tuple[int, str, float]:
            last = rcv.received[-1].body
            out_of_service_at_call.append(fleet.cluster(last["cluster"])["inService"] is False)
            if last["cluster"] == "cluster-00" and slow.pop("first", False):
                return (200, "ok", 4.0)  # slow: the orchestrator dies while it waits
            return (200, "ok", 0.0)

        rcv._answer = answer  # type: ignore[method-assign]
        first = orchestrators.start(identity="orchestrator-a")
        objects.create_cv(
            cluster_version(
                "fleet",
                fleet.address,
                ids(2),
                1,
                strategy={"hooks": {"postUpgrade": {"http": {"url": rcv.url}, "timeout": "1m"}}},
            )
        )
        run = objects.current_run("fleet")
        wait_for("the post-hook call arrives", lambda: rcv.received, timeout=60)
        first.kill()
        orchestrators.start(identity="orchestrator-b")
        failed = wait_for(
            "the restarted orchestrator fails the cluster",
            lambda: (s := objects.upgrade_status(run, "cluster-00")).get("phase") == "Failed" and s,
            timeout=60,
            interval=0.2,
        )
        assert failed["reason"] == "PostUpgradeHookFailed", failed
        assert (
            "hook outcome unknown after a restart; retry the cluster to run it again"
            in (failed["message"])
        )
        assert fleet.cluster("cluster-00")["inService"] is False  # failed out of service
        assert fleet.cluster("cluster-00")["controlPlaneVersion"] == NEW
        objects.patch_cv(
            "fleet",
            {"metadata": {"annotations": {"multicluster-ops.io/retry-clusters": "cluster-00"}}},
        )
        wait_for(
            "the rollout completes",
            lambda: objects.cv_phase_is("fleet", "Completed"),
            timeout=90,
            interval=0.2,
        )
        time.sleep(1.0)  # anything sent twice would have arrived by now
        keys = rcv.by_key()
        bodies = [r.body for r in rcv.received]
    assert sorted((b["cluster"], b["attempt"]) for b in bodies) == [
        ("cluster-00", 0),
        ("cluster-00", 1),
        ("cluster-01", 0),
    ]
    assert set(keys.values()) == {1}, keys  # each attempt's id exactly once
    assert all(out_of_service_at_call), out_of_service_at_call  # before the service-in
    final = objects.upgrade_status(run, "cluster-00")
    assert final["phase"] == "Upgraded" and final["attempt"] == 1, final
    m = fleet.monitor()
    assert m["clusters_at_target"] == 2 and m["available_in_service"] == 2, m
    assert m["duplicate_mutations"] == 0, m
