"""The real apiserver does what the controller relies on: CRDs with status, watches, Leases."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.rest import ApiException

from tests.support.kube import PROJECT_CRDS, KubeCluster, load_crds

GROUP = "kube-tests.fleet-upgrade.io"
PLURAL = "widgets"


def _widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": PLURAL, "singular": "widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {"phase": {"type": "string"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def widgets(control_plane: KubeCluster) -> str:
    """Install the Widget CRD (status subresource) once for this module."""
    (name,) = control_plane.install_crds(_widget_crd())
    return name


@pytest.fixture
def custom(control_plane: KubeCluster) -> Iterator[k8s.CustomObjectsApi]:
    with control_plane.api_client() as api:
        yield k8s.CustomObjectsApi(api)


def _widget(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
    }


#: The project's CRDs (every file of manifests/crds).
PROJECT_CRD_NAMES = tuple(c["metadata"]["name"] for c in load_crds(PROJECT_CRDS))
#: The rollout kinds: the controllers write their status through the status subresource.
ROLLOUT_CRD_NAMES = (
    "clusterversions.multicluster-ops.io",
    "updateruns.multicluster-ops.io",
    "clusterupgrades.multicluster-ops.io",
)


def test_project_crds_are_established(control_plane: KubeCluster) -> None:
    assert set(PROJECT_CRD_NAMES) >= set(ROLLOUT_CRD_NAMES)
    with control_plane.api_client() as api:
        extensions = k8s.ApiextensionsV1Api(api)
        crds = {n: extensions.read_custom_resource_definition(n) for n in PROJECT_CRD_NAMES}
    for name, crd in crds.items():
        conditions = {c.type: c.status for c in crd.status.conditions}
        assert conditions["Established"] == "True", name
    for name in ROLLOUT_CRD_NAMES:
        assert crds[name].spec.versions[0].subresources.status is not None, name


def test_status_goes_through_the_status_subresource_only(
    widgets: str, custom: k8s.CustomObjectsApi, namespace: str
) -> None:
    created = custom.create_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, _widget("w1", 3)
    )
    assert created["metadata"]["generation"] == 1

    # Status written through the main resource is dropped (that is what the subresource means).
    body = {**created, "status": {"phase": "Ignored"}}
    after_main = custom.replace_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "w1", body)
    assert "status" not in after_main

    # Through /status it sticks, and neither spec nor generation move.
    body = {**after_main, "status": {"phase": "Ready"}, "spec": {"size": 99}}
    after_status = custom.replace_namespaced_custom_object_status(
        GROUP, "v1", namespace, PLURAL, "w1", body
    )
    stored = custom.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "w1")
    assert stored["status"] == {"phase": "Ready"}
    assert stored["spec"] == {"size": 3}
    assert stored["metadata"]["generation"] == 1
    assert stored["metadata"]["resourceVersion"] == after_status["metadata"]["resourceVersion"]


def test_schema_validation_rejects_bad_spec(
    widgets: str, custom: k8s.CustomObjectsApi, namespace: str
) -> None:
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, _widget("bad", 0))
    assert error.value.status == 422
    assert "spec.size" in error.value.body


def test_a_watch_sees_the_status_update(
    widgets: str, control_plane: KubeCluster, custom: k8s.CustomObjectsApi, namespace: str
) -> None:
    created = custom.create_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, _widget("watched", 1)
    )
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def follow() -> None:
        # The watch ends in its own thread: Watch.stop() from another thread shuts the socket
        # under the reader, which then raises.
        with control_plane.api_client() as api:
            for event in watch.Watch().stream(
                k8s.CustomObjectsApi(api).list_namespaced_custom_object,
                GROUP,
                "v1",
                namespace,
                PLURAL,
                resource_version=created["metadata"]["resourceVersion"],
                timeout_seconds=30,
            ):
                events.put((event["type"], event["object"]))
                if event["type"] != "ADDED":
                    break

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    body = {**created, "status": {"phase": "Upgrading"}}
    custom.replace_namespaced_custom_object_status(GROUP, "v1", namespace, PLURAL, "watched", body)
    kind, obj = events.get(timeout=20)
    assert kind == "MODIFIED"
    assert obj["metadata"]["name"] == "watched"
    assert obj["status"] == {"phase": "Upgrading"}
    watcher.join(timeout=10)
    assert not watcher.is_alive()


def _lease(name: str, holder: str, now: datetime) -> k8s.V1Lease:
    return k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=15,
            acquire_time=now,
            renew_time=now,
            lease_transitions=0,
        ),
    )


def test_a_lease_is_taken_renewed_and_guarded_by_resource_version(
    control_plane: KubeCluster, namespace: str
) -> None:
    with control_plane.api_client() as api:
        leases = k8s.CoordinationV1Api(api)
        # Lease times are MicroTime: the apiserver wants six fraction digits, and the client
        # sends isoformat(), which drops them when microsecond == 0 (then: 400 Bad Request).
        now = datetime.now(UTC).replace(microsecond=250_000)
        taken = leases.create_namespaced_lease(namespace, _lease("leader", "me", now))

        # A second candidate cannot take an existing lease by creating it.
        with pytest.raises(ApiException) as exists:
            leases.create_namespaced_lease(namespace, _lease("leader", "other", now))
        assert exists.value.status == 409

        # Renewal: the holder moves renewTime forward with the resourceVersion it read.
        taken.spec.renew_time = now + timedelta(seconds=10)
        renewed = leases.replace_namespaced_lease("leader", namespace, taken)
        assert renewed.spec.holder_identity == "me"
        assert renewed.spec.renew_time == now + timedelta(seconds=10)
        assert renewed.metadata.resource_version != taken.metadata.resource_version

        # A competitor holding the old resourceVersion loses the race with 409 Conflict.
        taken.spec.holder_identity = "other"
        with pytest.raises(ApiException) as stale:
            leases.replace_namespaced_lease("leader", namespace, taken)
        assert stale.value.status == 409
        stored = leases.read_namespaced_lease("leader", namespace)
        assert stored.spec.holder_identity == "me"


def test_namespace_teardown_removes_objects_even_with_finalizers(
    control_plane: KubeCluster,
) -> None:
    with control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        with control_plane.temporary_namespace("teardown") as name:
            core.create_namespaced_config_map(
                name,
                k8s.V1ConfigMap(
                    metadata=k8s.V1ObjectMeta(name="held", finalizers=["example.com/hold"])
                ),
            )
        selector = f"metadata.namespace={name}"
        remaining = core.list_config_map_for_all_namespaces(field_selector=selector)
        assert remaining.items == []
        names = {n.metadata.name for n in core.list_namespace().items}
        assert name not in names


def test_extra_apiservers_share_etcd_but_not_objects(
    control_plane: KubeCluster, extra_apiserver: Any
) -> None:
    hub: KubeCluster = extra_apiserver("hub")
    assert extra_apiserver("hub") is hub
    assert hub.kubeconfig != control_plane.kubeconfig
    with (
        hub.temporary_namespace("only-on-hub") as marker,
        hub.api_client() as hub_api,
        control_plane.api_client() as main_api,
    ):
        hub_names = {n.metadata.name for n in k8s.CoreV1Api(hub_api).list_namespace().items}
        main_names = {n.metadata.name for n in k8s.CoreV1Api(main_api).list_namespace().items}
        hub_crds = k8s.ApiextensionsV1Api(hub_api).list_custom_resource_definition().items
    assert marker in hub_names
    assert marker not in main_names
    # The project's CRDs are installed on the main apiserver only.
    assert not set(PROJECT_CRD_NAMES) & {c.metadata.name for c in hub_crds}
