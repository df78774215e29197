"""The admission decision (orchestrator.adapters.webhook.admit / review), without a server: the same
checks as the controllers, the pinned fields of a started UpdateRun, and what is never refused."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import api
from orchestrator.adapters.webhook import admit, denial_message, review
from orchestrator.engine.access import AccessPolicy, check_access
from orchestrator.engine.initialize import as_cluster_version_spec
from orchestrator.engine.validate import Problem, parse_model, validate_spec

ROOT = Path(__file__).resolve().parents[2]
NS = "team-a"


def cv_spec(**extra: Any) -> dict[str, Any]:
    return {
        "requiredAvailableCount": 1,
        "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
        "clusters": [{"id": "a", "version": "1.29.4"}, {"id": "b", "version": "1.29.4"}],
        **extra,
    }


def request(
    kind: str,
    spec: dict[str, Any] | None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    **obj_extra: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "x", "namespace": NS}, **obj_extra}
    if spec is not None:
        obj["spec"] = spec
    req: dict[str, Any] = {
        "uid": "0d1c",
        "kind": {"group": api.GROUP, "version": api.VERSION, "kind": kind},
        "operation": operation,
        "namespace": NS,
        "name": "x",
        "object": obj,
    }
    if old is not None:
        req["oldObject"] = old
    return req


def started_run(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "x", "namespace": NS},
        "spec": spec,
        "status": {
            "phase": "Progressing",
            "conditions": [
                {
                    "type": "Initialized",
                    "status": "True",
                    "reason": "Pinned",
                    "lastTransitionTime": "2026-11-23T00:00:00Z",
                }
            ],
        },
    }


def fields(problems: Sequence[Problem]) -> dict[str, str]:
    return {p.field: p.message for p in problems}


# -- the controllers' validation, at admission ------------------------------------------------


def test_the_shipped_examples_are_admitted() -> None:
    judged = []
    for path in sorted((ROOT / "manifests" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in (api.KIND, api.UPDATE_RUN_KIND):
                assert admit(request(doc["kind"], doc["spec"])) == [], path.name
                judged.append(path.name)
    assert {"original.yaml", "staged.yaml"} <= set(judged)


def test_a_cluster_version_gets_the_controllers_problems_word_for_word() -> None:
    raw = cv_spec(
        requiredAvailableCount=2,
        clusters=[
            {"id": "a", "version": "1.29.4", "nodeVersion": "1.30.0"},
            {"id": "b", "version": "1.29.4"},
        ],
        strategy={"stages": [{"name": "s", "clusters": ["a"]}, {"name": "s", "clusters": ["b"]}]},
    )
    problems = admit(request(api.KIND, raw))
    parsed = parse_model(api.ClusterVersionSpec, raw)
    assert not isinstance(parsed, list)
    assert problems == validate_spec(parsed)  # exactly what the controller reports as Invalid
    got = fields(problems)
    assert "node pools may not run ahead" in got["spec.clusters[0].nodeVersion"]
    assert got["spec.strategy.stages[1].name"] == "'s' is used twice"


def test_the_floor_names_the_field_and_the_largest_allowed_value() -> None:
    got = fields(admit(request(api.KIND, cv_spec(requiredAvailableCount=2))))
    assert got == {
        "spec.requiredAvailableCount": "2 leaves no cluster allowed out of service among 2; "
        "set it to at most 1"
    }


def test_a_one_cluster_floor_says_what_can_work() -> None:
    # Not "set it to at most 0": the floor is at least 1, so a lone cluster cannot be rolled.
    one = cv_spec(clusters=[{"id": "a", "version": "1.29.4"}])
    assert fields(admit(request(api.KIND, one))) == {
        "spec.requiredAvailableCount": "1 leaves no cluster allowed out of service among 1; the "
        "floor is at least 1, so a rollout needs at least 2 clusters: add a cluster to it (the "
        "floor keeps one in service while the other upgrades), or upgrade a lone cluster with "
        "its provider's own tools"
    }
    two = {**one, "clusters": [{"id": "a", "version": "1.29.4"}, {"id": "b", "version": "1.29.4"}]}
    assert fields(admit(request(api.KIND, two))) == {}


def test_parse_errors_name_the_field() -> None:
    got = fields(admit(request(api.KIND, cv_spec(requiredAvailableCount=0, colour="blue"))))
    assert set(got) == {"spec.requiredAvailableCount", "spec.colour"}
    assert "remove it or check its spelling" in got["spec.colour"]
    assert fields(admit(request(api.KIND, None))) == {
        "spec": "is missing; set requiredAvailableCount, opsEndpoint and clusters"
    }


def test_a_direct_update_run_is_checked_like_its_cluster_version_shape() -> None:
    raw = cv_spec(clusters=None, requiredAvailableCount=1)
    problems = admit(request(api.UPDATE_RUN_KIND, raw))
    run = parse_model(api.UpdateRunSpec, raw)
    assert not isinstance(run, list)
    assert problems == validate_spec(as_cluster_version_spec(run))
    assert fields(problems) == {"spec.clusters": "is empty; list clusters or select them in stages"}


def test_a_run_a_cluster_version_created_carries_no_clusters_and_is_admitted() -> None:
    spec = {
        "state": "Run",
        "clusterVersionRef": {"name": "fleet", "generation": 3},
        "requiredAvailableCount": 1,
        "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
    }
    assert admit(request(api.UPDATE_RUN_KIND, spec)) == []


# -- what is never refused --------------------------------------------------------------------


def test_only_create_and_update_of_our_two_kinds_are_judged() -> None:
    bad = cv_spec(requiredAvailableCount=0)
    assert admit(request(api.KIND, bad, operation="DELETE")) == []
    assert admit(request(api.KIND, bad, operation="CONNECT")) == []
    assert admit(request("ClusterUpgrade", bad)) == []
    assert admit(request("ConfigMap", None)) == []


def test_an_update_that_leaves_spec_alone_is_admitted_even_for_a_stored_invalid_object() -> None:
    bad = cv_spec(requiredAvailableCount=5)  # admitted while the webhook was down
    old = {"metadata": {"name": "x"}, "spec": bad}
    relabelled = request(api.KIND, bad, "UPDATE", old, status={"phase": "Invalid"})
    relabelled["object"]["metadata"]["labels"] = {"team": "a"}
    assert admit(relabelled) == []
    changed = request(api.KIND, {**bad, "requiredAvailableCount": 6}, "UPDATE", old)
    assert "spec.requiredAvailableCount" in fields(admit(changed))
    deleting = request(api.KIND, {**bad, "requiredAvailableCount": 6}, "UPDATE", old)
    deleting["object"]["metadata"]["deletionTimestamp"] = "2026-11-23T00:00:00Z"
    assert admit(deleting) == []


# -- a started UpdateRun's pinned fields ------------------------------------------------------


def test_a_started_run_refuses_pinned_fields_and_names_each() -> None:
    before = cv_spec(strategy={"maxConcurrency": 1})
    after = copy.deepcopy(before)
    after["clusters"][1]["version"] = "1.30.1"
    after["strategy"]["maxConcurrency"] = 2
    after["timeouts"] = {"controlPlane": "10m"}
    got = fields(admit(request(api.UPDATE_RUN_KIND, after, "UPDATE", started_run(before))))
    assert set(got) == {"spec.clusters", "spec.strategy.maxConcurrency", "spec.timeouts"}
    for message in got.values():
        assert message.startswith("is pinned since the run started; only spec.state, ")
        assert "set spec.state: Stop and create a new UpdateRun" in message


def test_a_started_run_takes_state_floor_and_pause() -> None:
    before = cv_spec(
        requiredAvailableCount=1, clusters=[{"id": c, "version": "1.29.4"} for c in ("a", "b", "c")]
    )
    after = {**before, "state": "Stop", "requiredAvailableCount": 2, "strategy": {"paused": True}}
    assert admit(request(api.UPDATE_RUN_KIND, after, "UPDATE", started_run(before))) == []


def test_a_run_not_started_yet_may_still_change() -> None:
    before = cv_spec()
    after = {**before, "clusters": [{"id": c, "version": "1.30.1"} for c in ("a", "b", "c")]}
    old = started_run(before)
    started = admit(request(api.UPDATE_RUN_KIND, after, "UPDATE", old))
    assert [p.field for p in started] == ["spec.clusters"]  # the same change, once started
    old["status"]["conditions"][0]["status"] = "False"
    assert admit(request(api.UPDATE_RUN_KIND, after, "UPDATE", old)) == []
    del old["status"]
    assert admit(request(api.UPDATE_RUN_KIND, after, "UPDATE", old)) == []


# -- the access check -------------------------------------------------------------------------


def test_access_problems_come_first_as_the_controllers_put_them() -> None:
    policy = AccessPolicy.default("fleet-upgrade-system")

    def access(namespace: str, spec: api.ClusterVersionSpec | api.UpdateRunSpec) -> list[Problem]:
        found = check_access(namespace, spec, {}, {}, policy)
        return found if isinstance(found, list) else []

    problems = admit(request(api.KIND, cv_spec(requiredAvailableCount=2)), access)
    assert [p.field for p in problems] == ["spec.opsEndpoint", "spec.requiredAvailableCount"]
    assert "inline plugin endpoints are not allowed in namespace team-a" in problems[0].message
    assert "--allow-inline-endpoints-in=team-a" in problems[0].message


def test_an_access_check_that_cannot_answer_admits_with_a_warning() -> None:
    def down(namespace: str, spec: api.ClusterVersionSpec | api.UpdateRunSpec) -> list[Problem]:
        raise RuntimeError("FleetProviders and MetricSources are not listed yet")

    answer = review(envelope(request(api.KIND, cv_spec())), down)["response"]
    assert answer["allowed"] is True
    assert "the controller checks again" in answer["warnings"][0]


# -- the AdmissionReview envelope -------------------------------------------------------------


def envelope(req: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def test_a_denial_is_422_invalid_with_one_cause_per_field() -> None:
    answer = review(envelope(request(api.KIND, cv_spec(requiredAvailableCount=2))))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    response = answer["response"]
    assert response["uid"] == "0d1c" and response["allowed"] is False
    status = response["status"]
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["message"] == (
        "spec.requiredAvailableCount: 2 leaves no cluster allowed out of service among 2; "
        "set it to at most 1"
    )
    assert status["details"]["kind"] == api.KIND
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.requiredAvailableCount",
            "message": "2 leaves no cluster allowed out of service among 2; set it to at most 1",
        }
    ]
    assert review(envelope(request(api.KIND, cv_spec())))["response"] == {
        "uid": "0d1c",
        "allowed": True,
    }


def test_a_long_denial_is_cut_after_ten_problems() -> None:
    problems = [Problem(f"spec.f{i}", "wrong") for i in range(13)]
    text = denial_message(problems)
    assert text.count("wrong") == 10 and text.endswith("; and 3 more")


@pytest.mark.parametrize(
    "body",
    [
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}},
    ],
)
def test_anything_but_a_v1_admission_review_is_an_error(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="AdmissionReview"):
        review(body)
