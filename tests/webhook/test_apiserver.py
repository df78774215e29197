"""The admission webhook on the real apiserver (1.20): the shipped ValidatingWebhookConfiguration
(manifests/install/webhook.yaml) registered with a URL to the real `fleet-orchestrator run
--webhook-addr` on loopback (no Service networking here), its self-managed CA injected by the
orchestrator; `kubectl apply` refused with the field and the fix, accepted, a started UpdateRun's
pinned fields refused while state and pause pass, and a down or hung webhook blocking nothing.

The configuration matches only namespaces carrying this module's label, so nothing else on the
session's apiserver goes through it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from orchestrator import api
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import OrchestratorProcess, free_port, simulated_fleet

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "manifests" / "install" / "webhook.yaml"
DENIED = 'admission webhook "validate.multicluster-ops.io" denied the request'
OLD, NEW = "1.28.5", "1.29.1"
CLUSTERS = ["c0", "c1", "c2"]


def shipped_config() -> dict[str, Any]:
    (config,) = [
        d
        for d in yaml.safe_load_all(SHIPPED.read_text())
        if d and d["kind"] == "ValidatingWebhookConfiguration"
    ]
    return dict(config)


def registered(name: str, port: int, label: str) -> dict[str, Any]:
    """The shipped configuration, called by URL on loopback, for namespaces labelled `label`."""
    config = copy.deepcopy(shipped_config())
    config["metadata"]["name"] = name
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate"}
        hook["namespaceSelector"] = {"matchLabels": {"fleet-webhook-test": label}}
    return config


def cluster_version(name: str, endpoint: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "requiredAvailableCount": 2,
            "opsEndpoint": {"endpoint": endpoint, "insecure": True},
            "clusters": [{"id": c, "version": NEW} for c in CLUSTERS],
            **spec,
        },
    }


def apply(cluster: KubeCluster, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    """`kubectl apply -f -`; (exit code, stdout + stderr)."""
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


@dataclass
class Stack:
    cluster: KubeCluster
    namespace: str
    label: str
    config: str
    port: int
    sim_address: str
    orchestrator: OrchestratorProcess
    custom: k8s.CustomObjectsApi
    core: k8s.CoreV1Api
    admission: k8s.AdmissionregistrationV1Api

    def exists(self, plural: str, name: str) -> bool:
        try:
            self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, self.namespace, plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def refused_dry_run(self) -> bool:
        """True once the apiserver sends our kinds to the webhook (a dry run leaves nothing)."""
        body = cluster_version("probe", self.sim_address, requiredAvailableCount=3)
        try:
            self.custom.create_namespaced_custom_object(
                api.GROUP, api.VERSION, self.namespace, api.PLURAL, body, dry_run="All"
            )
        except ApiException as err:
            return err.status == 422 and DENIED in json.loads(err.body)["message"]
        return False


@contextlib.contextmanager
def labelled_namespace(cluster: KubeCluster, prefix: str, label: str) -> Iterator[str]:
    with cluster.temporary_namespace(prefix) as name:
        core = k8s.CoreV1Api(cluster.api_client())
        core.patch_namespace(name, {"metadata": {"labels": {"fleet-webhook-test": label}}})
        yield name


@pytest.fixture
def stack(control_plane: KubeCluster, tmp_path: Path) -> Iterator[Stack]:
    """Sim fleet + `fleet-orchestrator run --webhook-addr` + the shipped configuration by URL."""
    label = uuid.uuid4().hex[:10]
    name = f"fleet-webhook-test-{label}"
    port = free_port()
    client = control_plane.api_client()
    admission = k8s.AdmissionregistrationV1Api(client)
    fleet = {
        "defaults": {
            "stepSeconds": {"serviceOut": 2, "serviceIn": 2, "controlPlane": 2, "nodePool": 2}
        },
        "clusters": [
            {"id": c, "controlPlaneVersion": OLD, "nodePools": [{"name": "p", "version": OLD}]}
            for c in CLUSTERS
        ],
    }
    with (
        labelled_namespace(control_plane, "webhook", label) as namespace,
        simulated_fleet(tmp_path, fleet, NEW) as sim,
    ):
        admission.create_validating_webhook_configuration(registered(name, port, label))
        orchestrator = OrchestratorProcess(
            control_plane.kubeconfig,
            namespace,
            tmp_path / "orchestrator.log",
            "--webhook-addr",
            f"127.0.0.1:{port}",
            "--webhook-host",
            "127.0.0.1",
            "--webhook-config",
            name,
        ).start()
        try:
            yield Stack(
                control_plane,
                namespace,
                label,
                name,
                port,
                sim.address,
                orchestrator,
                k8s.CustomObjectsApi(client),
                k8s.CoreV1Api(client),
                admission,
            )
        finally:
            orchestrator.stop()
            with contextlib.suppress(ApiException):
                admission.delete_validating_webhook_configuration(name)


def wait_until_enforced(stack: Stack) -> bytes:
    """The CA the orchestrator injected, once the apiserver enforces the webhook with it."""

    def injected() -> bytes | None:
        hooks = stack.admission.read_validating_webhook_configuration(stack.config).webhooks
        bundles = {h.client_config.ca_bundle for h in hooks}
        return base64.b64decode(bundles.pop()) if None not in bundles else None

    ca = wait_for("the CA bundle injected", injected, timeout=60, interval=0.2)
    wait_for("the apiserver calls the webhook", stack.refused_dry_run, timeout=30, interval=0.2)
    return bytes(ca)


def test_the_orchestrator_injects_its_ca_and_kubectl_apply_is_refused_with_field_and_fix(
    stack: Stack,
) -> None:
    ca = wait_until_enforced(stack)
    secret = stack.core.read_namespaced_secret("fleet-orchestrator-webhook-tls", stack.namespace)
    assert base64.b64decode(secret.data["ca.crt"]) == ca  # the shared pair every replica serves

    code, out = apply(
        stack.cluster,
        stack.namespace,
        cluster_version("floor", stack.sim_address, requiredAvailableCount=3),
    )
    # kubectl shows the webhook's 422 like the apiserver's own validation: kind, name, causes.
    assert code != 0, out
    assert (
        'The ClusterVersion "floor" is invalid: spec.requiredAvailableCount: 3 leaves no '
        "cluster allowed out of service among 3; set it to at most 2" in out
    ), out
    assert not stack.exists(api.PLURAL, "floor")

    ahead = cluster_version("ahead", stack.sim_address)
    ahead["spec"]["clusters"][0]["nodeVersion"] = "1.30.0"
    code, out = apply(stack.cluster, stack.namespace, ahead)
    assert (
        code != 0
        and "spec.clusters[0].nodeVersion: 1.30.0 is newer than the control "
        "plane target 1.29.1; node pools may not run ahead of the control plane"
        in out
    ), out
    assert not stack.exists(api.PLURAL, "ahead")

    code, out = apply(stack.cluster, stack.namespace, cluster_version("fleet", stack.sim_address))
    assert code == 0 and "clusterversion.multicluster-ops.io/fleet created" in out, out
    assert stack.exists(api.PLURAL, "fleet")


def test_kubectl_apply_refuses_short_timeouts_and_selectors_kubernetes_would_reject(
    stack: Stack,
) -> None:
    """Issue 19: what the 1.20 schema cannot say (a minimum above zero, In without values) is
    refused by the webhook at apply, with the field and the fix; nothing is stored."""
    wait_until_enforced(stack)
    short = cluster_version("short", stack.sim_address, timeouts={"controlPlane": "1s"})
    code, out = apply(stack.cluster, stack.namespace, short)
    assert code != 0, out
    assert (
        'The ClusterVersion "short" is invalid: spec.timeouts.controlPlane: 1s is too short: '
        "a step bound under 2s can end a step the moment it starts; set it to 2s or more" in out
    ), out
    assert not stack.exists(api.PLURAL, "short")

    spec = cluster_version("x", stack.sim_address)["spec"]
    spec["strategy"] = {
        "stages": [
            {
                "name": "all",
                "clusters": CLUSTERS,
                "selector": {"matchExpressions": [{"key": "region", "operator": "NotIn"}]},
            }
        ]
    }
    run = {
        "apiVersion": api.API_VERSION,
        "kind": api.UPDATE_RUN_KIND,
        "metadata": {"name": "picky"},
        "spec": spec,
    }
    code, out = apply(stack.cluster, stack.namespace, run)
    assert code != 0, out
    assert (
        'The UpdateRun "picky" is invalid: '
        "spec.strategy.stages[0].selector.matchExpressions[0].values: must list at least one "
        "value when operator is NotIn" in out
    ), out
    assert not stack.exists(api.UPDATE_RUN_PLURAL, "picky")


def test_inline_endpoints_outside_the_allowed_namespaces_are_refused_at_admission(
    stack: Stack, control_plane: KubeCluster
) -> None:
    wait_until_enforced(stack)
    with labelled_namespace(control_plane, "webhook-team", stack.label) as team:
        code, out = apply(control_plane, team, cluster_version("fleet", stack.sim_address))
        assert code != 0 and 'The ClusterVersion "fleet" is invalid' in out, out
        assert (
            f"spec.opsEndpoint: inline plugin endpoints are not allowed in namespace {team}" in out
        ), out
        assert f"--allow-inline-endpoints-in={team}" in out, out  # how to allow it
        with pytest.raises(ApiException) as refused:
            stack.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, team, api.PLURAL, "fleet"
            )
        assert refused.value.status == 404


def test_a_started_run_refuses_its_pinned_fields_and_takes_pause_floor_and_stop(
    stack: Stack,
) -> None:
    wait_until_enforced(stack)
    run = {
        "apiVersion": api.API_VERSION,
        "kind": api.UPDATE_RUN_KIND,
        "metadata": {"name": "once"},
        "spec": cluster_version("once", stack.sim_address, requiredAvailableCount=1)["spec"],
    }
    code, out = apply(stack.cluster, stack.namespace, run)
    assert code == 0, out

    def get() -> dict[str, Any]:
        return dict(
            stack.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, stack.namespace, api.UPDATE_RUN_PLURAL, "once"
            )
        )

    def initialized() -> bool:
        conditions = (get().get("status") or {}).get("conditions") or []
        return any(c["type"] == "Initialized" and c["status"] == "True" for c in conditions)

    wait_for("the run pins its clusters", initialized, timeout=60, interval=0.2)

    def patch(body: dict[str, Any]) -> dict[str, Any]:
        return dict(
            stack.custom.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, stack.namespace, api.UPDATE_RUN_PLURAL, "once", body
            )
        )

    with pytest.raises(ApiException) as refused:
        patch({"spec": {"strategy": {"maxConcurrency": 3}}})
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert message.startswith(
        DENIED + ": spec.strategy.maxConcurrency: is pinned since the run "
        "started; only spec.state, spec.requiredAvailableCount and "
        "spec.strategy.paused may change"
    ), message
    assert "create a new UpdateRun" in message

    targets = copy.deepcopy(get()["spec"]["clusters"])
    targets[0]["version"] = "1.29.2"
    with pytest.raises(ApiException) as refused:
        patch({"spec": {"clusters": targets}})
    assert (
        "spec.clusters: is pinned since the run started"
        in json.loads(refused.value.body)["message"]
    )
    assert get()["spec"]["clusters"][0]["version"] == NEW  # nothing stored

    assert (
        patch({"spec": {"strategy": {"paused": True}, "requiredAvailableCount": 2}})["spec"][
            "strategy"
        ]["paused"]
        is True
    )
    assert patch({"spec": {"state": "Stop"}})["spec"]["state"] == "Stop"
    assert get()["spec"]["requiredAvailableCount"] == 2


def test_a_down_or_hung_webhook_blocks_nothing_within_its_timeout(stack: Stack) -> None:
    wait_until_enforced(stack)  # the apiserver demonstrably calls it...
    stack.orchestrator.stop()  # ...and now nothing listens on its port
    timeout = shipped_config()["webhooks"][0]["timeoutSeconds"]
    assert shipped_config()["webhooks"][0]["failurePolicy"] == "Ignore"

    def timed_create(body: dict[str, Any], plural: str | None) -> float:
        start = time.monotonic()
        if plural is None:
            stack.core.create_namespaced_config_map(stack.namespace, body)
        else:
            stack.custom.create_namespaced_custom_object(
                api.GROUP, api.VERSION, stack.namespace, plural, body
            )
        return time.monotonic() - start

    unrelated = {"metadata": {"name": "unrelated"}, "data": {"k": "v"}}
    assert timed_create(unrelated, None) < 2.0
    down = timed_create(
        cluster_version("while-down", stack.sim_address, requiredAvailableCount=3), api.PLURAL
    )
    assert down < timeout, down  # connection refused: admitted at once
    assert stack.exists(api.PLURAL, "while-down")  # the controller will say Invalid later

    # Hung: the port accepts connections and never answers; the apiserver gives up after
    # timeoutSeconds and admits.
    with socket.socket() as hung:
        hung.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hung.bind(("127.0.0.1", stack.port))
        hung.listen(16)
        hung_cv = timed_create(
            cluster_version("while-hung", stack.sim_address, requiredAvailableCount=3),
            api.PLURAL,
        )
        hung_cm = timed_create({"metadata": {"name": "unrelated-2"}}, None)
    assert timeout - 1 <= hung_cv < timeout + 5, hung_cv
    assert stack.exists(api.PLURAL, "while-hung")
    assert hung_cm < 2.0, hung_cm  # other kinds never wait on it


def test_a_webhook_that_cannot_start_leaves_the_controller_running(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    fleet = {
        "defaults": {
            "stepSeconds": {
                "serviceOut": 0.2,
                "serviceIn": 0.2,
                "controlPlane": 0.2,
                "nodePool": 0.2,
            }
        },
        "clusters": [
            {"id": c, "controlPlaneVersion": OLD, "nodePools": [{"name": "p", "version": OLD}]}
            for c in CLUSTERS
        ],
    }
    log = tmp_path / "orchestrator.log"
    with (
        simulated_fleet(tmp_path, fleet, NEW) as sim,
        socket.socket() as taken,  # the webhook's port is taken: it cannot listen
    ):
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        orchestrator = OrchestratorProcess(
            control_plane.kubeconfig,
            namespace,
            log,
            "--webhook-addr",
            f"127.0.0.1:{port}",
            "--webhook-config",
            "",
        ).start()
        try:
            custom = k8s.CustomObjectsApi(control_plane.api_client())
            custom.create_namespaced_custom_object(
                api.GROUP,
                api.VERSION,
                namespace,
                api.PLURAL,
                cluster_version("fleet", sim.address),
            )

            def completed() -> bool:
                cv = custom.get_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, "fleet"
                )
                return (cv.get("status") or {}).get("phase") == "Completed"

            wait_for(
                "the rollout completes without the webhook", completed, timeout=90, interval=0.2
            )
            for cid in CLUSTERS:
                assert sim.fleet.get_cluster(cid).cluster.control_plane_version == NEW
        finally:
            orchestrator.stop()
    text = log.read_text()
    assert "admission webhook not serving (retrying in 30s" in text, text
    assert "Address already in use" in text, text


def test_a_provider_and_a_spec_naming_it_apply_together(
    stack: Stack, control_plane: KubeCluster
) -> None:
    """providerRef at admission: a FleetProvider and a spec naming it, in one `kubectl apply`,
    are admitted (should the webhook's caches lag, a refusal is confirmed on a fresh read); a
    spec naming a provider that does not exist is refused with what to do."""
    wait_until_enforced(stack)
    provider = f"sim-{stack.label}"
    with labelled_namespace(control_plane, "webhook-team", stack.label) as team:
        declared = {
            "apiVersion": api.API_VERSION,
            "kind": api.FLEET_PROVIDER_KIND,
            "metadata": {"name": provider},
            "spec": {
                "endpoint": stack.sim_address,
                "insecure": True,
                "allowedNamespaces": {"names": [team]},
            },
        }
        named = cluster_version("fleet", stack.sim_address)
        del named["spec"]["opsEndpoint"]
        named["spec"]["providerRef"] = {"name": provider}
        elsewhere = copy.deepcopy(named)
        elsewhere["metadata"]["name"] = "elsewhere"
        elsewhere["spec"]["providerRef"] = {"name": f"other-{stack.label}"}
        try:
            kubectl = shutil.which("kubectl")
            assert kubectl
            done = subprocess.run(
                [
                    kubectl,
                    "--kubeconfig",
                    str(control_plane.kubeconfig),
                    "-n",
                    team,
                    "apply",
                    "-f",
                    "-",
                ],
                input=yaml.safe_dump_all([declared, named]),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            stack.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, team, api.PLURAL, "fleet"
            )
            code, out = apply(control_plane, team, elsewhere)
            assert code != 0, out
            assert (
                f"spec.providerRef.name: FleetProvider other-{stack.label} does not exist; name "
                f"one that allows namespace {team}" in out
            ), out
        finally:
            with contextlib.suppress(ApiException):
                stack.custom.delete_cluster_custom_object(
                    api.GROUP, api.VERSION, api.FLEET_PROVIDER_PLURAL, provider
                )
