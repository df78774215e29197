"""Who asked: the mutating webhook stamps the authenticated user on the requests people make
(engine/requester.py decides what the orchestrator records from it), pure."""

from __future__ import annotations

import base64
import json
from typing import Any

from orchestrator import api
from orchestrator.adapters.webhook import mutation_review, stamp
from orchestrator.engine.requester import attested, handed, handover, requester

NS = "team-a"
SA = "system:serviceaccount:fleet-upgrade-system:fleet-orchestrator"
SPEC = {"requiredAvailableCount": 1, "clusters": [{"id": "a", "version": "1.29.4"}]}


def obj(annotations: dict[str, str] | None = None, spec: Any = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "prod", "namespace": NS}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": SPEC if spec is None else spec}


def request(
    new: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = "alice",
    groups: tuple[str, ...] = ("platform", "system:authenticated"),
) -> dict[str, Any]:
    return {
        "uid": "u1",
        "kind": {"group": api.GROUP, "version": api.VERSION, "kind": api.KIND},
        "operation": "UPDATE" if old is not None else "CREATE",
        "userInfo": {"username": user, "groups": list(groups)},
        "object": new,
        "oldObject": old,
    }


def applied(new: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, str]:
    """The annotations after the JSON patch (add/remove on /metadata/annotations only)."""
    annotations = dict(new["metadata"].get("annotations") or {})
    for op in ops:
        if op["path"] == "/metadata/annotations":
            annotations = dict(op["value"])
            continue
        key = op["path"].split("/", 3)[3].replace("~1", "/").replace("~0", "~")
        if op["op"] == "add":
            annotations[key] = op["value"]
        else:
            del annotations[key]
    return annotations


def test_a_retry_is_stamped_with_the_authenticated_user_not_the_typed_one() -> None:
    old = obj({})
    typed = {api.ANNOTATION_RETRY_CLUSTERS: "c3", api.ANNOTATION_REQUESTED_BY: "cto@example.com"}
    # The writer also typed a user of their own: overwritten.
    new = obj({**typed, api.ANNOTATION_REQUESTED_BY_USER: "cto@example.com"})
    after = applied(new, stamp(request(new, old)))
    assert after[api.ANNOTATION_REQUESTED_BY_USER] == "alice"
    assert after[api.ANNOTATION_REQUESTED_BY_GROUPS] == "platform"
    assert requester(after, SPEC) == "alice (as cto@example.com)"
    # Without a typed display name: the user alone.
    plain = obj({api.ANNOTATION_RETRY_CLUSTERS: "c3"})
    assert requester(applied(plain, stamp(request(plain, old))), SPEC) == "alice"


def test_spec_changes_are_stamped_and_other_writes_keep_the_old_stamp() -> None:
    first = obj({})
    stamped = applied(first, stamp(request(first)))  # CREATE: the creator asked
    assert requester(stamped, SPEC) == "alice"
    before = obj(stamped)
    # A stop (spec.state) by bob: stamped bob.
    stopped = obj(stamped, {**SPEC, "state": "Stop"})
    after = applied(stopped, stamp(request(stopped, before, user="bob", groups=())))
    assert requester(after, stopped["spec"]) == "bob"
    assert after[api.ANNOTATION_REQUESTED_BY_GROUPS] == ""
    # A label edit by mallory that also types a user: the stamp she did not earn is put back.
    forged = obj({**stamped, api.ANNOTATION_REQUESTED_BY_USER: "mallory-says-cto"})
    forged["metadata"]["labels"] = {"x": "y"}
    after = applied(forged, stamp(request(forged, before, user="mallory")))
    assert after == stamped


def test_while_the_webhook_is_down_what_changed_is_unauthenticated() -> None:
    # failurePolicy Ignore: a retry written while no replica answered keeps alice's old stamp,
    # which does not vouch for the new annotations: recorded as "unauthenticated".
    first = obj({api.ANNOTATION_RETRY_CLUSTERS: "c1"})
    stamped = applied(first, stamp(request(first)))
    unchecked = {
        **stamped,
        api.ANNOTATION_RETRY_CLUSTERS: "c3",
        api.ANNOTATION_REQUESTED_BY: "cto@example.com",
    }
    assert requester(unchecked, SPEC) == "unauthenticated (as cto@example.com)"
    assert requester({api.ANNOTATION_RETRY_CLUSTERS: "c3"}, SPEC) == "unauthenticated"
    # ... and is not handed to the run as alice's.
    assert handed(unchecked, SPEC) == {}
    assert handed(stamped, SPEC) == {
        api.ANNOTATION_REQUESTED_BY_USER: "alice",
        api.ANNOTATION_REQUESTED_BY_GROUPS: "platform",
    }


def test_the_orchestrator_hands_the_user_to_the_run() -> None:
    first = obj({api.ANNOTATION_RETRY_CLUSTERS: "c3"})
    cv = applied(first, stamp(request(first)))
    run_spec = {"state": "Run", "clusterVersionRef": {"name": "prod", "generation": 1}}
    old_run = obj({}, run_spec)
    # The controller's patch: the moved retry with the ClusterVersion's user and groups.
    moved = {api.ANNOTATION_RETRY_CLUSTERS: "c3", **handed(cv, SPEC)}
    new_run = obj(moved, run_spec)
    after = applied(new_run, stamp(request(new_run, old_run, user=SA), frozenset({SA})))
    assert requester(after, run_spec) == "alice"
    # The same write by anyone else is stamped with who wrote it.
    after = applied(new_run, stamp(request(new_run, old_run, user="mallory")))
    assert requester(after, run_spec) == "mallory"
    # A trusted write keeping a user whose stamp did not vouch for the run: dropped.
    stale = obj({**moved, api.ANNOTATION_REQUESTED_BY_STAMP: "0" * 32}, run_spec)
    edited = obj({**moved, api.ANNOTATION_REQUESTED_BY_STAMP: "0" * 32, "x": "1"}, run_spec)
    after = applied(edited, stamp(request(edited, stale, user=SA), frozenset({SA})))
    assert requester(after, run_spec) == "unauthenticated"
    assert attested(after, run_spec) != "0" * 32


def test_the_cluster_version_hands_who_asked_only_with_a_request() -> None:
    """engine.requester.handover, as the ClusterVersion controller patches its current run: a
    request (a moved retry, a copied skip-stages, a live spec field) goes with the typed words
    and the ClusterVersion's stamped user; without one, a request bob made on the run itself
    keeps bob, never told as alice's (she wrote the ClusterVersion last)."""
    first = obj({api.ANNOTATION_RETRY_CLUSTERS: "c3", api.ANNOTATION_REQUESTED_BY: "Alice"})
    cv = applied(first, stamp(request(first)))  # alice
    run_spec = {"state": "Run", "clusterVersionRef": {"name": "prod", "generation": 1}}
    patch = handover(cv, SPEC, {}, spec_handed=False)
    assert patch == {
        api.ANNOTATION_RETRY_CLUSTERS: "c3",
        api.ANNOTATION_REQUESTED_BY: "Alice",
        api.ANNOTATION_REQUESTED_BY_USER: "alice",
        api.ANNOTATION_REQUESTED_BY_GROUPS: "platform",
    }
    # bob skips a cluster on the run itself, through the webhook: stamped bob.
    old_run = obj({}, run_spec)
    bobs = obj({api.ANNOTATION_SKIP_CLUSTERS: "c1", api.ANNOTATION_REQUESTED_BY: "bob"}, run_spec)
    run = applied(bobs, stamp(request(bobs, old_run, user="bob", groups=())))
    assert requester(run, run_spec) == "bob"
    # The ClusterVersion's retry consumed, nothing asked of the run: its who-asked stays bob's.
    # (the controller removes it from the ClusterVersion as itself: the webhook re-stamps).
    consumed = obj({k: v for k, v in cv.items() if k != api.ANNOTATION_RETRY_CLUSTERS})
    done = applied(consumed, stamp(request(consumed, obj(cv), user=SA), frozenset({SA})))
    assert requester(done, SPEC) == "alice (as Alice)"
    assert handover(done, SPEC, run, spec_handed=False) == {}
    # A live spec field (a floor, a pause) is a request: alice's, with her stamp.
    said = handover(done, SPEC, run, spec_handed=True)
    assert said[api.ANNOTATION_REQUESTED_BY_USER] == "alice"
    assert said[api.ANNOTATION_REQUESTED_BY] == "Alice"
    # A skip-stages differing from the run's is one too; the ClusterVersion's stamp no longer
    # vouching (written with the webhook down), the user goes: unauthenticated.
    unvouched = {**done, api.ANNOTATION_SKIP_STAGES: "main"}
    said = handover(unvouched, SPEC, run, spec_handed=False)
    assert said[api.ANNOTATION_SKIP_STAGES] == "main"
    assert said[api.ANNOTATION_REQUESTED_BY_USER] is None
    assert said[api.ANNOTATION_REQUESTED_BY_GROUPS] is None


def test_the_mutation_review_carries_a_json_patch_and_always_allows() -> None:
    new = obj({api.ANNOTATION_RETRY_CLUSTERS: "c3"})
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request(new)}
    response = mutation_review(body)["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "u1",
        True,
        "JSONPatch",
    )
    ops = json.loads(base64.b64decode(response["patch"]))
    assert applied(new, ops)[api.ANNOTATION_REQUESTED_BY_USER] == "alice"
    # Kinds other than ours are never patched.
    other = {**request(new), "kind": {"group": "", "version": "v1", "kind": "ConfigMap"}}
    assert stamp(other) == []
