"""The Job hook executor against the real apiserver: the Job it creates (name, labels, owner,
deadline, env in every container, no TTL), adoption instead of a second Job (also by a new
process), the outcome from the Job's conditions (written here in the job controller's place:
no controller-manager runs in tests), a Job of that name that is not ours, and a template the
apiserver rejects."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from orchestrator import api
from orchestrator.adapters.hooks import LABEL_HOOK_ID, HookExecutor
from orchestrator.adapters.kube import KubeClient
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.secrets import TLSResolver
from orchestrator.engine.decide import POST_HOOK, HookObs, HookState, hook_id
from orchestrator.pipeline.driver import HookRequest
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.kube

RUNS = "multicluster_controller_hook_runs"


def _template(**spec: Any) -> dict[str, Any]:
    return {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": 5,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
                "containers": [
                    {
                        "name": "hook",
                        "image": "busybox",
                        "command": ["sh", "-c", "echo $CLUSTER_ID"],
                        "env": [{"name": "HOOK", "value": "mine"}, {"name": "KEEP", "value": "1"}],
                    },
                    {"name": "side", "image": "busybox"},
                ],
            }
        },
        **spec,
    }


@pytest.fixture
def kube(control_plane: KubeCluster) -> Iterator[KubeClient]:
    client = KubeClient(str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def batch(control_plane: KubeCluster) -> k8s.BatchV1Api:
    return k8s.BatchV1Api(control_plane.api_client())


def _upgrade(kube: KubeClient, namespace: str, name: str = "rollout-1-0a1b2c") -> str:
    obj = kube.create_object(
        api.CLUSTER_UPGRADE_PLURAL,
        namespace,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.CLUSTER_UPGRADE_KIND,
            "metadata": {"name": name, "labels": {api.LABEL_RUN: "rollout-1"}},
            "spec": {
                "clusterId": "prod-east",
                "stage": "default",
                "stageIndex": 0,
                "version": "1.29.1",
                "nodeVersion": "1.29.1",
                "provider": "127.0.0.1:9000",
            },
        },
    )
    return str(obj["metadata"]["uid"])


def _request(namespace: str, template: dict[str, Any], attempt: int = 2) -> HookRequest:
    return HookRequest(
        run=f"{namespace}/rollout-1",
        run_uid="uid-7",
        upgrade="rollout-1-0a1b2c",
        cluster_id="prod-east",
        kind=POST_HOOK,
        id=hook_id("uid-7", "prod-east", POST_HOOK, attempt),
        attempt=attempt,
        hook=api.Hook.model_validate({"job": {"template": template}, "timeout": "15m"}),
        current_version="1.29.1",
        target_version="1.29.1",
        start_time=datetime.now(UTC),
    )


def _complete(batch: k8s.BatchV1Api, namespace: str, name: str, kind: str, **extra: str) -> None:
    """Write the Job's terminal condition as the job controller would."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cond = {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
    status: dict[str, Any] = {"conditions": [{**cond, **extra}], "startTime": now}
    if kind == "Complete":
        status.update(succeeded=1, completionTime=now)
    else:
        status.update(failed=1)
    batch.patch_namespaced_job_status(name, namespace, {"status": status})


def test_the_job_is_created_once_owned_and_given_the_hook_env(
    kube: KubeClient, batch: k8s.BatchV1Api, namespace: str
) -> None:
    uid = _upgrade(kube, namespace)
    req = _request(namespace, _template())
    ex = HookExecutor(kube, TLSResolver(kube))
    ex.start(req)
    assert ex.observe(req) == HookObs(HookState.RUNNING)
    ex.start(req)  # AlreadyExists: adopted
    HookExecutor(kube, TLSResolver(kube)).start(req)  # a new process adopts it too
    jobs = batch.list_namespaced_job(namespace).items
    assert [j.metadata.name for j in jobs] == [req.id]
    job = kube.get_job(namespace, req.id)
    meta, spec = job["metadata"], job["spec"]
    assert len(req.id) <= 63
    assert meta["labels"] == {
        api.LABEL_RUN: "rollout-1",
        "multicluster-ops.io/cluster-upgrade": "rollout-1-0a1b2c",
        "multicluster-ops.io/hook": "postUpgrade",
        LABEL_HOOK_ID: req.id,
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": api.API_VERSION,
            "kind": api.CLUSTER_UPGRADE_KIND,
            "name": "rollout-1-0a1b2c",
            "uid": uid,
            "controller": True,
        }
    ]
    assert spec["activeDeadlineSeconds"] == 900
    assert "ttlSecondsAfterFinished" not in spec
    ours = {
        "CLUSTER_ID": "prod-east",
        "CLUSTER_VERSION": "1.29.1",
        "TARGET_VERSION": "1.29.1",
        "HOOK": "postUpgrade",
        "RUN": "rollout-1",
        "ATTEMPT": "2",
    }
    pod = spec["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert {k: env[k] for k in ours} == ours
        assert [e["name"] for e in c["env"]].count("HOOK") == 1
    assert {e["name"]: e["value"] for e in pod["containers"][0]["env"]}["KEEP"] == "1"


def test_the_outcome_comes_from_the_job_conditions(
    kube: KubeClient, batch: k8s.BatchV1Api, namespace: str
) -> None:
    _upgrade(kube, namespace)
    metrics = Metrics()
    ex = HookExecutor(kube, TLSResolver(kube), metrics=metrics)
    ok, bad = _request(namespace, _template(), 0), _request(namespace, _template(), 1)
    ex.start(ok)
    ex.start(bad)
    _complete(batch, namespace, ok.id, "Complete")
    _complete(
        batch, namespace, bad.id, "Failed", reason="BackoffLimitExceeded", message="exit code 3"
    )
    # A new process (a restart) sees the same outcomes: they live on the Jobs.
    fresh = HookExecutor(kube, TLSResolver(kube))
    for executor in (ex, fresh):
        assert executor.observe(ok) == HookObs(HookState.SUCCEEDED, f"Job {ok.id} complete")
        assert executor.observe(bad) == HookObs(
            HookState.FAILED, f"Job {bad.id} failed: BackoffLimitExceeded: exit code 3"
        )
    assert ex.observe(ok).state == HookState.SUCCEEDED
    counted = {
        result: metrics.registry.get_sample_value(
            f"{RUNS}_total", {"hook": "postUpgrade", "type": "job", "result": result}
        )
        for result in ("succeeded", "failed")
    }
    assert counted == {"succeeded": 1, "failed": 1}  # observed on every pass, counted once


def test_a_job_not_created_yet_is_unknown(kube: KubeClient, namespace: str) -> None:
    ex = HookExecutor(kube, TLSResolver(kube))
    assert ex.observe(_request(namespace, _template())) == HookObs(HookState.UNKNOWN)


def test_a_job_of_that_name_that_is_not_ours_fails_the_hook(
    kube: KubeClient, batch: k8s.BatchV1Api, namespace: str
) -> None:
    _upgrade(kube, namespace)
    req = _request(namespace, _template())
    body = {"metadata": {"name": req.id}, "spec": _template()}
    body["spec"].pop("ttlSecondsAfterFinished")
    batch.create_namespaced_job(namespace, body)
    ex = HookExecutor(kube, TLSResolver(kube))
    ex.start(req)
    seen = ex.observe(req)
    assert seen.state == HookState.FAILED
    assert f"a Job named {req.id} exists that this hook did not create" in seen.message


def test_a_template_the_apiserver_rejects_fails_the_hook(kube: KubeClient, namespace: str) -> None:
    _upgrade(kube, namespace)
    template = _template()
    template["template"]["spec"]["restartPolicy"] = "Always"  # not allowed for a Job
    req = _request(namespace, template)
    ex = HookExecutor(kube, TLSResolver(kube))
    ex.start(req)
    seen = ex.observe(req)
    assert seen.state == HookState.FAILED
    assert seen.message.startswith(f"Job {req.id} not created: 422")
    assert "restartPolicy" in seen.message
