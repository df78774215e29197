"""Issue 12 item 5: every transition reaches the receiver once, though it was down for a while,
and the rollout does not wait for it; one Kubernetes Event per transition per object."""

from __future__ import annotations

import base64
import time
from collections import Counter
from collections.abc import Callable, Iterator
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
    metric_checks,
    reconcile_errors,
)
from tests.notify.receiver import Receiver
from tests.support.kube import wait_for

TOKEN = "e2e-bearer-t0ken"
QUERY = 'error_ratio{cluster="{{ cluster }}"}'


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def secret(objects: Objects, name: str, data: dict[str, str]) -> None:
    body = k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(name=name),
        data={k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    )
    objects.core.create_namespaced_secret(objects.ns, body)


def update_run(endpoint: str) -> dict[str, Any]:
    """A one-shot UpdateRun: two stages, a health gate, two notification endpoints."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.UPDATE_RUN_KIND,
        "metadata": {"name": "notify"},
        "spec": {
            "requiredAvailableCount": 3,
            "opsEndpoint": {"endpoint": endpoint, "insecure": True},
            "clusters": [{"id": c, "version": NEW} for c in ids(4)],
            "healthChecks": metric_checks(QUERY, 0.01, success=2),
            "strategy": {
                "stages": [
                    {"name": "canary", "clusters": ids(2)},
                    {"name": "rest", "clusters": ids(4)[2:]},
                ]
            },
            "notifications": [
                {
                    "name": "events",
                    "type": "CloudEvents",
                    "urlSecretRef": {"name": "hooks", "key": "cloudevents-url"},
                    "bearerTokenSecretRef": {"name": "hooks", "key": "token"},
                },
                {
                    "name": "chat",
                    "type": "Slack",
                    "urlSecretRef": {"name": "hooks", "key": "slack-url"},
                    "events": ["ClusterFailed", "RunHalted"],
                },
            ],
        },
    }


def test_each_transition_is_delivered_once_after_the_receiver_comes_back(
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
    receiver: Receiver,
) -> None:
    fleet = sim(
        fleet_file(
            4,
            step=0.2,
            metrics={'error_ratio{cluster="{{cluster}}"}': 0.0},
            faults={"failStep": [{"step": "controlPlane", "clusters": ["cluster-03"]}]},
        )
    )
    secret(
        objects,
        "hooks",
        {
            "cloudevents-url": receiver.url,
            "slack-url": receiver.url.replace("/hooks/", "/slack/"),
            "token": TOKEN,
        },
    )
    receiver.mode = "503"  # the receiver is there but failing
    receiver.start()
    proc = orchestrators.start("--step-events")  # every step of a cluster: an Event each
    objects.api.create_namespaced_custom_object(
        api.GROUP, api.VERSION, objects.ns, api.UPDATE_RUN_PLURAL, update_run(fleet.address)
    )

    def phase() -> str | None:
        return (objects.run("notify").get("status") or {}).get("phase")

    wait_for("the first 503s", lambda: receiver.refused_503 >= 2, timeout=60)
    receiver.stop()  # and now it is gone altogether: connection refused
    wait_for("the run halts on cluster-03", lambda: phase() == "Halted", timeout=120)
    # The rollout finished while the receiver was still down: it never waited for it.
    assert receiver.requests() == []
    m = fleet.monitor()
    assert m["clusters_at_target"] == 3 and m["duplicate_mutations"] == 0, m
    receiver.mode = "ok"
    receiver.release.clear()
    receiver.start()
    uid = objects.run("notify")["metadata"]["uid"]
    expected = {
        f"{uid}/RunStarted": "RunStarted",
        f"{uid}/StageStarted/canary": "StageStarted",
        f"{uid}/StageStarted/rest": "StageStarted",
        f"{uid}/ClusterFailed/cluster-03/0": "ClusterFailed",
    }

    def cloudevents() -> list[dict[str, Any]]:
        return [r.json() for r in receiver.requests() if r.path.startswith("/hooks/")]

    def arrived() -> bool:
        return len({e["id"] for e in cloudevents()}) >= 7  # the seven transitions below

    wait_for("every transition arrives", arrived, timeout=90, interval=0.5)
    time.sleep(3.0)  # quiet period: a duplicate (a retry of a delivered one) would arrive here
    events = cloudevents()
    by_id = Counter(e["id"] for e in events)
    assert all(n == 1 for n in by_id.values()), by_id
    kinds = sorted(e["type"].rsplit(".", 1)[1] for e in events)
    assert kinds == sorted(
        [
            "RunStarted",
            "StageStarted",
            "StageCompleted",
            "StageStarted",
            "ClusterFailed",
            "StageFailed",
            "RunHalted",
        ]
    ), kinds
    for event_id, kind in expected.items():
        assert by_id[event_id] == 1, (event_id, kind, sorted(by_id))
    # Per endpoint in order: the run started first and halted last.
    assert events[0]["type"].endswith(".RunStarted") and events[-1]["type"].endswith(".RunHalted")
    failed = next(e for e in events if e["type"].endswith(".ClusterFailed"))
    assert (
        failed["source"]
        == f"/apis/multicluster-ops.io/v1/namespaces/{objects.ns}/updateruns/notify"
    )
    assert failed["subject"] == "cluster-03" and failed["data"]["stage"] == "rest"
    assert failed["specversion"] == "1.0" and failed["data"]["run"] == "notify"
    hooks = [r for r in receiver.requests() if r.path.startswith("/hooks/")]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in hooks)
    assert all(r.headers["content-type"].startswith("application/cloudevents+json") for r in hooks)
    slack = [r.json()["text"] for r in receiver.requests() if r.path.startswith("/slack/")]
    assert len(slack) == 2 and "ClusterFailed cluster-03" in slack[0] and "RunHalted" in slack[1]

    # Kubernetes Events: one per transition per object, none per health-check evaluation.
    def ours() -> list[Any]:
        return [
            e for e in objects.events() if e.source and e.source.component == "fleet-orchestrator"
        ]

    wait_for("the run's Events", lambda: any(e.reason == "RunHalted" for e in ours()), timeout=30)
    # (object, reason, message): a stage's Events differ by message (two stages start).
    transitions = Counter((e.involved_object.name, e.reason, e.message) for e in ours())
    assert all(n == 1 for n in transitions.values()), transitions
    recorded = Counter((name, reason) for name, reason, _ in transitions)
    on_run = sorted(r for (name, r), n in recorded.items() if name == "notify" for _ in range(n))
    assert on_run == sorted(
        ["RunStarted", "StageStarted", "StageStarted", "StageCompleted", "StageFailed", "RunHalted"]
    ), on_run
    upgrades = objects.upgrades("notify")
    for cid in ("cluster-00", "cluster-01", "cluster-02"):
        name = upgrades[cid]["metadata"]["name"]
        phases = {r for (n, r) in recorded if n == name}
        # Verifying once, though its checks were evaluated at least twice (successThreshold 2).
        assert upgrades[cid]["status"]["health"]["passes"] >= 2
        assert phases == {
            "ServicingOut",
            "UpgradingControlPlane",
            "UpgradingNodePools",
            "Verifying",
            "ServicingIn",
            "Upgraded",
        }, (cid, phases)
    failed_name = upgrades["cluster-03"]["metadata"]["name"]
    assert recorded[(failed_name, "Failed")] == 1
    metrics = proc.metrics()
    assert 'multicluster_controller_notification_deliveries_total{result="delivered"} 9.0' in (
        metrics
    ), [line for line in metrics.splitlines() if "notification" in line]
    dropped = [
        line
        for line in metrics.splitlines()
        if line.startswith(
            'multicluster_controller_notification_deliveries_total{result="dropped"}'
        )
    ]
    assert all(line.endswith(" 0.0") for line in dropped), dropped
    logs = orchestrators.logs()
    assert TOKEN not in logs and "T0SECRET" not in logs and "xoxSECRETPATH" not in logs
    assert not reconcile_errors(logs)

    # A restart sends nothing again: transitions come only from a pass's own writes.
    proc.stop()
    delivered, recorded_events = len(receiver.requests()), len(ours())
    again = orchestrators.start("--step-events", identity="orchestrator-e2e-restarted")

    def reconciled() -> bool:
        try:
            text = again.metrics()
        except OSError:
            return False
        success = 'multicluster_controller_reconcile_total{result="success"}'
        return any(
            line.startswith(success) and not line.endswith(" 0.0") for line in text.splitlines()
        )

    wait_for("the restarted orchestrator reconciles the run", reconciled, timeout=60)
    time.sleep(7.0)  # quiet period: more than a resync (5 s) of the halted run
    assert len(receiver.requests()) == delivered
    assert len(ours()) == recorded_events
    assert not reconcile_errors(orchestrators.logs())


def test_a_cluster_versions_notifications_are_its_runs(
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
    receiver: Receiver,
) -> None:
    fleet = sim(fleet_file(2, step=0.2))
    receiver.start()
    secret(objects, "hooks", {"url": receiver.url})
    orchestrators.start()
    notifications = [
        {
            "name": "events",
            "urlSecretRef": {"name": "hooks", "key": "url"},
            "events": ["RunStarted", "RunSucceeded"],
        }
    ]
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(2), 1, notifications=notifications)
    )
    run = objects.current_run("fleet")
    wait_for("the rollout completes", lambda: objects.cv_phase_is("fleet", "Completed"), timeout=60)
    uid = objects.run(run)["metadata"]["uid"]

    def ids_received() -> list[str]:
        return [b["id"] for b in receiver.bodies()]

    wait_for("both arrive", lambda: len(ids_received()) == 2, timeout=30)
    time.sleep(2.0)  # quiet period: nothing else was asked for
    received = ids_received()
    assert received[0] == f"{uid}/RunStarted" and received[1].startswith(f"{uid}/RunSucceeded/")
    assert len(received) == 2
    assert all(b["source"].endswith(f"/updateruns/{run}") for b in receiver.bodies())


def test_no_notification_where_inline_endpoints_are_not_allowed(
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
    receiver: Receiver,
) -> None:
    """A notification URL is an address the namespace's users choose (in a Secret): like an
    inline endpoint, it is used only where the orchestrator's configuration allows. The rollout
    itself (through a FleetProvider the admin declared) goes on, and a Warning Event says why."""
    fleet = sim(fleet_file(2, step=0.2))
    receiver.start()
    secret(objects, "hooks", {"url": receiver.url})
    provider = f"notify-{objects.ns}"[:63]
    objects.api.create_cluster_custom_object(
        api.GROUP,
        api.VERSION,
        api.FLEET_PROVIDER_PLURAL,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.FLEET_PROVIDER_KIND,
            "metadata": {"name": provider},
            "spec": {
                "endpoint": fleet.address,
                "insecure": True,
                "allowedNamespaces": {"names": [objects.ns]},
            },
        },
    )
    try:
        orchestrators.start(f"--allow-inline-endpoints-in={objects.ns}-elsewhere")
        body = cluster_version("fleet", fleet.address, ids(2), 1)
        del body["spec"]["opsEndpoint"]
        body["spec"]["providerRef"] = {"name": provider}
        body["spec"]["notifications"] = [
            {"name": "events", "urlSecretRef": {"name": "hooks", "key": "url"}}
        ]
        objects.create_cv(body)
        wait_for(
            "the rollout completes", lambda: objects.cv_phase_is("fleet", "Completed"), timeout=60
        )
        refused = wait_for(
            "a Warning Event says why",
            lambda: [e for e in objects.events() if e.reason == "NotificationsNotAllowed"],
            timeout=30,
        )
        assert len(refused) == 1 and refused[0].type == "Warning"
        assert "--allow-inline-endpoints-in" in refused[0].message
        time.sleep(2.0)  # quiet period: nothing is sent
        assert receiver.requests() == []
        assert not reconcile_errors(orchestrators.logs())
    finally:
        orchestrators.stop_all()
        objects.api.delete_cluster_custom_object(
            api.GROUP, api.VERSION, api.FLEET_PROVIDER_PLURAL, provider
        )
