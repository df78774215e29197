"""Issue 19, "Zero timeouts strand clusters" and "A typo completes a rollout", on the real stack:
kube-apiserver (1.20, no webhook installed here: tests/webhook/test_apiserver.py has the
webhook's refusals), `fleet-orchestrator run`, the sim plugin over gRPC.

What cannot work is refused at apply by the CRD schema where it can say so (a duration that is
not positive), else by the controllers as Invalid with the field or the stage named. In every
case the world is asserted: the sim saw no mutating call, and every cluster is still in
service at its old version.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import yaml

from orchestrator import api
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
from tests.support.kube import KubeCluster, wait_for

N = 4


def tiered_fleet() -> dict[str, Any]:
    """Four clusters: cluster-00/01 tier gold, cluster-02/03 tier silver."""
    tiers = {cid: "gold" if i < 2 else "silver" for i, cid in enumerate(ids(N))}
    return fleet_file(
        N, per_cluster={cid: {"labels": {"index": cid[-1], "tier": t}} for cid, t in tiers.items()}
    )


def untouched(fleet: Sim) -> None:
    """The world: no mutating call reached the plugin; every cluster in service, at OLD."""
    m = fleet.monitor()
    assert m["mutations_total"] == 0 and m["operations_in_flight"] == 0, m
    assert m["min_available_in_service"] == N, m
    for cid in ids(N):
        c = fleet.cluster(cid)
        assert c["inService"] and c["available"], c
        assert c["controlPlaneVersion"] == OLD, c
        assert {p["version"] for p in c["nodePools"]} == {OLD}, c


def kubectl_apply(cluster: KubeCluster, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH"
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "apply", "-f", "-"],
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def direct_run(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.UPDATE_RUN_KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def create_run(objects: Objects, body: dict[str, Any]) -> None:
    objects.api.create_namespaced_custom_object(
        api.GROUP, api.VERSION, objects.ns, api.UPDATE_RUN_PLURAL, body
    )


def no_upgrades(objects: Objects) -> bool:
    items = objects.api.list_namespaced_custom_object(
        api.GROUP, api.VERSION, objects.ns, api.CLUSTER_UPGRADE_PLURAL
    )["items"]
    return not items


def never_completes(objects: Objects, run: str, seconds: float) -> None:
    """Watch the run for a while: it stays Invalid, never Succeeded, pins no cluster."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        status = objects.run(run).get("status") or {}
        assert status.get("phase") == "Invalid", status
        time.sleep(0.25)
    assert no_upgrades(objects)


def test_zero_and_negative_durations_are_refused_at_apply_by_the_schema(
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
    control_plane: KubeCluster,
) -> None:
    fleet = sim(tiered_fleet())
    orchestrators.start()
    for field, value, spec in (
        ("spec.timeouts.nodePool", "0s", {"timeouts": {"nodePool": "0s"}}),
        ("spec.timeouts.serviceOut", "-5s", {"timeouts": {"serviceOut": "-5s"}}),
        (
            "spec.strategy.stages.soakTime",  # the 1.20 apiserver names list items so
            "0h0m",
            {"strategy": {"stages": [{"name": "all", "clusters": ids(N), "soakTime": "0h0m"}]}},
        ),
    ):
        body = cluster_version("zero", fleet.address, ids(N), 2, **spec)
        code, out = kubectl_apply(control_plane, objects.ns, body)
        assert code != 0, out
        assert 'The ClusterVersion "zero" is invalid' in out and field in out, out
        assert f'Invalid value: "{value}"' in out, out
        # The same refusal for an UpdateRun created directly.
        code, out = kubectl_apply(control_plane, objects.ns, direct_run("zero", body["spec"]))
        assert code != 0 and field in out, out
    assert (
        objects.api.list_namespaced_custom_object(api.GROUP, api.VERSION, objects.ns, api.PLURAL)[
            "items"
        ]
        == []
    )
    assert objects.runs() == []
    time.sleep(1.0)
    untouched(fleet)


def test_a_below_minimum_timeout_past_a_missing_webhook_is_invalid_and_takes_nothing_out(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(tiered_fleet())
    orchestrators.start()
    # 1500ms is positive (the schema admits it) but under the 2s minimum of a step bound.
    objects.create_cv(
        cluster_version("short", fleet.address, ids(N), 2, timeouts={"serviceIn": "1500ms"})
    )
    status = wait_for(
        "the ClusterVersion is Invalid", lambda: objects.cv_phase_is("short", "Invalid"), timeout=30
    )
    assert status["message"].startswith("spec.timeouts.serviceIn: 1500ms is too short"), status
    assert "set it to 2s or more" in status["message"], status
    assert objects.runs() == []  # no run was created for it

    # A run created directly, with a health check interval under its minimum.
    spec = cluster_version("x", fleet.address, ids(N), 2)["spec"]
    spec["healthChecks"] = {
        "interval": "50ms",
        "timeout": "30s",
        "checks": [
            {
                "name": "ratio",
                "metric": {
                    "provider": {"type": "plugin"},
                    "query": "error_ratio",
                    "thresholdRange": {"max": 0.1},
                },
            }
        ],
    }
    create_run(objects, direct_run("fast", spec))
    run = wait_for(
        "the run is Invalid", lambda: objects.run_phase_is("fast", "Invalid"), timeout=30
    )
    assert run["message"].startswith("spec.healthChecks.interval: 50ms is too short"), run
    never_completes(objects, "fast", 3.0)
    untouched(fleet)
    assert not reconcile_errors(orchestrators.logs())


def test_a_stage_selector_with_a_typo_makes_the_run_invalid_naming_the_stage(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(tiered_fleet())
    orchestrators.start()
    body = cluster_version(
        "tiers",
        fleet.address,
        [],
        1,  # the gold stage alone could run: without the rule, gold upgrades and it completes
        strategy={
            "stages": [
                {"name": "gold", "selector": {"matchLabels": {"tier": "gold"}}},
                {"name": "silver", "selector": {"matchLabels": {"tier": "silvr"}}},
            ]
        },
    )
    del body["spec"]["clusters"]
    body["spec"]["version"] = NEW
    objects.create_cv(body)
    run = objects.current_run("tiers")
    status = wait_for(
        "the run is Invalid", lambda: objects.run_phase_is(run, "Invalid"), timeout=30
    )
    assert status["message"].startswith(
        "spec.strategy.stages[1]: stage 'silver' selects no cluster"
    ), status
    assert '"silvr"' in status["message"], status  # the selector as written: the typo shows
    cv = wait_for("the ClusterVersion says so", lambda: objects.cv_phase_is("tiers", "Invalid"))
    assert "stage 'silver' selects no cluster" in cv["message"], cv
    never_completes(objects, run, 5.0)
    assert objects.cv_status("tiers")["phase"] == "Invalid"
    untouched(fleet)

    # A direct run whose In selects a value no cluster carries: the same, for that stage.
    spec = {
        **body["spec"],
        "strategy": {
            "stages": [
                {
                    "name": "bronze",
                    "selector": {
                        "matchExpressions": [
                            {"key": "tier", "operator": "In", "values": ["bronze"]}
                        ]
                    },
                },
                {"name": "all", "selector": {"matchLabels": {}}},
            ]
        },
    }
    create_run(objects, direct_run("bronze", spec))
    status = wait_for(
        "the run is Invalid", lambda: objects.run_phase_is("bronze", "Invalid"), timeout=30
    )
    assert status["message"].startswith(
        "spec.strategy.stages[0]: stage 'bronze' selects no cluster"
    ), status
    never_completes(objects, "bronze", 2.0)
    untouched(fleet)
    assert not reconcile_errors(orchestrators.logs())


def test_operator_in_without_values_is_refused_and_takes_nothing_out(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    """Kubernetes' own validation refuses it; the 1.20 schema cannot (it needs values only for
    In / NotIn), so without the webhook the controller does, before any run exists."""
    fleet = sim(tiered_fleet())
    orchestrators.start()
    body = cluster_version(
        "empty-in",
        fleet.address,
        [],
        2,
        strategy={
            "stages": [
                {
                    "name": "picked",
                    "selector": {"matchExpressions": [{"key": "tier", "operator": "In"}]},
                }
            ]
        },
    )
    del body["spec"]["clusters"]
    body["spec"]["version"] = NEW
    objects.create_cv(body)
    status = wait_for(
        "the ClusterVersion is Invalid",
        lambda: objects.cv_phase_is("empty-in", "Invalid"),
        timeout=30,
    )
    assert status["message"].startswith(
        "spec.strategy.stages[0].selector.matchExpressions[0].values: must list at least one "
        "value when operator is In"
    ), status
    time.sleep(2.0)
    assert objects.runs() == [] and no_upgrades(objects)
    untouched(fleet)
    assert not reconcile_errors(orchestrators.logs())
