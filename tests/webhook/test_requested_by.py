"""Who asked, on the real apiserver: the shipped MutatingWebhookConfiguration registered by URL
to the real `fleet-orchestrator run --webhook-addr` (its self-managed CA injected by the
orchestrator), requests made as other users by impersonation (Impersonate-User, as
`kubectl --as alice --as-group platform` sends them). The annotation a writer types is
overwritten with the authenticated user; with the webhook down (failurePolicy Ignore) the write
is admitted and what the orchestrator records is "unauthenticated", never the typed name."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from orchestrator import api
from orchestrator.engine.requester import requester
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import OrchestratorProcess, free_port
from tests.webhook.test_apiserver import SHIPPED, labelled_namespace

SPEC = {
    "requiredAvailableCount": 1,
    "opsEndpoint": {"endpoint": "127.0.0.1:1", "insecure": True},
    "clusters": [{"id": "c0", "version": "1.29.1"}, {"id": "c1", "version": "1.29.1"}],
    "strategy": {"paused": True},
}


def shipped_mutating() -> dict[str, Any]:
    (config,) = [
        d
        for d in yaml.safe_load_all(SHIPPED.read_text())
        if d and d["kind"] == "MutatingWebhookConfiguration"
    ]
    return dict(config)


def as_user(cluster: KubeCluster, user: str, group: str = "") -> k8s.CustomObjectsApi:
    """The objects API as `kubectl --as USER [--as-group GROUP]` calls it."""
    api_client = cluster.api_client()
    api_client.set_default_header("Impersonate-User", user)
    if group:
        api_client.set_default_header("Impersonate-Group", group)
    return k8s.CustomObjectsApi(api_client)


@pytest.fixture
def mutating(
    control_plane: KubeCluster, tmp_path: Path
) -> Iterator[tuple[str, OrchestratorProcess]]:
    label = uuid.uuid4().hex[:10]
    name = f"fleet-requested-by-{label}"
    port = free_port()
    admission = k8s.AdmissionregistrationV1Api(control_plane.api_client())
    config = copy.deepcopy(shipped_mutating())
    config["metadata"]["name"] = name
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
        hook["namespaceSelector"] = {"matchLabels": {"fleet-webhook-test": label}}
    with labelled_namespace(control_plane, "requested-by", label) as namespace:
        # The people of this test may write in its namespace (and nowhere else).
        rbac = k8s.RbacAuthorizationV1Api(control_plane.api_client())
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "people"},
                "rules": [
                    {
                        "apiGroups": [api.GROUP],
                        "resources": [api.PLURAL],
                        "verbs": ["get", "create", "patch", "delete"],
                    }
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "people"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "people",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": who}
                    for who in ("alice", "bob", "mallory")
                ],
            },
        )
        admission.create_mutating_webhook_configuration(config)
        orchestrator = OrchestratorProcess(
            control_plane.kubeconfig,
            namespace,
            tmp_path / "orchestrator.log",
            *("--webhook-addr", f"127.0.0.1:{port}", "--webhook-host", "127.0.0.1"),
            *("--webhook-config", name),
            # The controller's own identity here (the kubeconfig's admin, not the installed
            # ServiceAccount): its hand-offs and consumptions keep the user they carry.
            *("--webhook-trusted-user", "admin"),
        ).start()
        try:
            yield namespace, orchestrator
        finally:
            orchestrator.stop()
            with contextlib.suppress(ApiException):
                admission.delete_mutating_webhook_configuration(name)


def _annotations(objects: k8s.CustomObjectsApi, namespace: str, name: str) -> dict[str, str]:
    obj = objects.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return dict(obj["metadata"].get("annotations") or {})


def _recorded(objects: k8s.CustomObjectsApi, namespace: str, name: str) -> str:
    """Who asked, as the orchestrator records it from the stored object."""
    obj = objects.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return requester(obj["metadata"].get("annotations") or {}, obj.get("spec"))


def test_the_authenticated_user_is_stamped_and_a_typed_one_is_not_taken(
    control_plane: KubeCluster, mutating: tuple[str, OrchestratorProcess]
) -> None:
    namespace, orchestrator = mutating
    alice = as_user(control_plane, "alice", "platform")
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "prod"},
        "spec": SPEC,
    }

    def stamped() -> dict[str, str] | None:
        # The orchestrator injects its CA first; until then the apiserver admits unstamped.
        made = alice.create_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, body, dry_run="All"
        )
        return made if (made["metadata"].get("annotations") or {}) else None

    wait_for("the apiserver calls the mutating webhook", stamped, timeout=60, interval=0.5)
    made = alice.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, body
    )
    found = made["metadata"]["annotations"]
    assert (found[api.ANNOTATION_REQUESTED_BY_USER], found[api.ANNOTATION_REQUESTED_BY_GROUPS]) == (
        "alice",
        "platform",
    )
    # bob retries, typing someone else's name in both the display and the stamped annotation.
    bob = as_user(control_plane, "bob")
    bob.patch_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        namespace,
        api.PLURAL,
        "prod",
        {
            "metadata": {
                "annotations": {
                    api.ANNOTATION_RETRY_CLUSTERS: "c1",
                    api.ANNOTATION_REQUESTED_BY: "cto@example.com",
                    api.ANNOTATION_REQUESTED_BY_USER: "cto@example.com",
                }
            }
        },
    )
    now = _annotations(bob, namespace, "prod")
    assert now[api.ANNOTATION_REQUESTED_BY_USER] == "bob"
    assert _recorded(bob, namespace, "prod") == "bob (as cto@example.com)"
    # The controller hands the retry to the ClusterVersion's run, with bob as who asked.
    admin = k8s.CustomObjectsApi(control_plane.api_client())

    def handed_run() -> str | None:
        runs = admin.list_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            namespace,
            api.UPDATE_RUN_PLURAL,
            label_selector=f"{api.LABEL_CLUSTER_VERSION}=prod",
        )["items"]
        for run in runs:
            said = run["metadata"].get("annotations") or {}
            if said.get(api.ANNOTATION_RETRY_CLUSTERS) == "c1":
                return requester(said, run.get("spec"))
        return None

    assert wait_for("the retry handed to the run", handed_run, timeout=30) == (
        "bob (as cto@example.com)"
    )
    # A write that asks nothing (a label) by mallory, typing a user: bob's stamp stays.
    mallory = as_user(control_plane, "mallory")
    mallory.patch_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        namespace,
        api.PLURAL,
        "prod",
        {
            "metadata": {
                "labels": {"team": "a"},
                "annotations": {api.ANNOTATION_REQUESTED_BY_USER: "alice"},
            }
        },
    )
    assert _annotations(mallory, namespace, "prod")[api.ANNOTATION_REQUESTED_BY_USER] == "bob"

    # The webhook down: admitted (failurePolicy Ignore), the old stamp kept, and what the
    # orchestrator records is "unauthenticated", with the typed name only beside it.
    orchestrator.stop()
    mallory.patch_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        namespace,
        api.PLURAL,
        "prod",
        {
            "metadata": {
                "annotations": {
                    api.ANNOTATION_SKIP_CLUSTERS: "c0",
                    api.ANNOTATION_REQUESTED_BY: "cto@example.com",
                }
            }
        },
    )
    down = _annotations(mallory, namespace, "prod")
    assert down[api.ANNOTATION_SKIP_CLUSTERS] == "c0"
    assert down[api.ANNOTATION_REQUESTED_BY_USER] == "bob"
    assert _recorded(mallory, namespace, "prod") == "unauthenticated (as cto@example.com)"
