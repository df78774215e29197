"""The image run as manifests/ installs it: in-cluster configuration, the shipped RBAC, a rollout.

Each container of the rendered Deployment runs with `podman run --network host` (the pod's
shared loopback) and the flags its securityContext asks for (--read-only, --user 65532,
--cap-drop ALL, no-new-privileges, a tmpfs where the Deployment mounts an emptyDir). The
kubelet's part is played by the test: a real token of the install's ServiceAccount
(TokenRequest) and the apiserver's CA in a directory mounted at
/var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT pointing at the
local apiserver (its serving certificate covers 127.0.0.1), POD_NAMESPACE from the downward API.
manifests/install is applied as shipped (its RBAC, the webhook's registration and RBAC).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devtools.controlplane import REPO_ROOT
from orchestrator import api
from tests.install.conftest import podman
from tests.install.served import as_served
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl, kustomize, yaml_docs
from tests.support.orchestrator import CV, free_port

INSTALL = REPO_ROOT / "manifests" / "install"
ORIGINAL = REPO_ROOT / "manifests" / "examples" / "original.yaml"
HOME = "fleet-upgrade-system"
SA_NAME = "fleet-orchestrator"
LEASE = "fleet-orchestrator"  # --leader-election-id's default; POD_NAMESPACE holds it
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
OLD, NEW = "1.28.9-gke.1000", "1.29.4-gke.1043002"

pytestmark = pytest.mark.slow


def _deployment() -> dict[str, Any]:
    """The Deployment as `kubectl apply -k manifests/` installs it (images: applied)."""
    (deployment,) = [
        d for d in yaml_docs(kustomize(REPO_ROOT / "manifests")) if d["kind"] == "Deployment"
    ]
    return deployment


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    pod = deployment["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def _pod_flags(deployment: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """podman flags for what the pod spec asks of this container (each key checked, so a
    manifest change that this translation does not cover fails here instead of passing)."""
    pod = deployment["spec"]["template"]["spec"]
    pod_ctx, ctx = pod["securityContext"], container["securityContext"]
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}  # podman's default profile
    assert pod_ctx["runAsNonRoot"] is True and ctx["runAsNonRoot"] is True
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    flags = [
        "--network",
        "host",
        "--read-only",
        "--user",
        f"{pod_ctx['runAsUser']}:{pod_ctx['runAsGroup']}",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]
    for mount in container["volumeMounts"]:
        assert "emptyDir" in volumes[mount["name"]], mount
        flags += ["--tmpfs", f"{mount['mountPath']}:rw,size=64m"]
    for env in container.get("env", []):
        if "value" in env:
            flags += ["-e", f"{env['name']}={env['value']}"]
        else:
            assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, env
            flags += ["-e", f"{env['name']}={deployment['metadata']['namespace']}"]
    return flags


def _with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """args with the value after flag replaced (the flag must be there)."""
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2 :]]


class Containers:
    """podman containers started by one test; removed (logs kept) when it ends."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.prefix = f"fleet-it-{uuid.uuid4().hex[:8]}"
        self.names: list[str] = []

    def run(self, name: str, flags: list[str], entrypoint: list[str], args: list[str]) -> str:
        full = f"{self.prefix}-{name}"
        (command, *rest) = entrypoint
        done = podman(
            "run", "-d", "--name", full, *flags, "--entrypoint", command, self.image, *rest, *args
        )
        assert done.returncode == 0, done.stderr
        self.names.append(full)
        return full

    def logs(self, name: str) -> str:
        done = podman("logs", name)
        return done.stdout + done.stderr

    def running(self, name: str) -> bool:
        done = podman("inspect", "--format", "{{.State.Running}}", name)
        return done.stdout.strip() == "true"

    def exit_code(self, name: str) -> int:
        done = podman("inspect", "--format", "{{.State.ExitCode}}", name)
        return int(done.stdout.strip())

    def stop(self, name: str, grace: int) -> None:
        done = podman("stop", "-t", str(grace), name, timeout=grace + 30)
        assert done.returncode == 0, done.stderr

    def remove_all(self) -> None:
        """Print each container's log tail (shown when the test failed), then remove it."""
        for name in self.names:
            print(f"--- {name}\n{self.logs(name)[-4000:]}")
            podman("rm", "-f", "-t", "5", name, timeout=60)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def shipped_install(control_plane: KubeCluster) -> Iterator[None]:
    """manifests/install applied as shipped (namespace, RBAC, webhook registration, Services,
    the Deployment, which nothing here runs: the test runs its pods); removed afterwards."""
    control_plane.delete_namespace(HOME)  # what an earlier test may have left: a fresh start
    docs = yaml.safe_dump_all(as_served(control_plane, yaml_docs(kustomize(INSTALL))))
    kubectl(control_plane, "apply", "-f", "-", stdin=docs)
    try:
        yield
    finally:
        kubectl(
            control_plane, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=docs
        )
        control_plane.delete_namespace(HOME)


def _service_account_dir(cluster: KubeCluster, tmp: Path, namespace: str, name: str) -> Path:
    """What the kubelet mounts for a pod of this ServiceAccount: token (TokenRequest API),
    ca.crt (the apiserver's CA) and namespace, readable by the image's user."""
    directory = tmp / f"sa-{name}"
    directory.mkdir()
    token = kubectl(cluster, "create", "token", name, "-n", namespace, "--duration", "1h")
    (directory / "token").write_text(token.strip())
    config = json.loads(cluster.kubeconfig.read_text())
    ca_file = Path(config["clusters"][0]["cluster"]["certificate-authority"])
    (directory / "ca.crt").write_text(ca_file.read_text())
    (directory / "namespace").write_text(namespace)
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


def _user_kubeconfig(cluster: KubeCluster, tmp: Path, namespace: str, name: str) -> Path:
    """A kubeconfig authenticating as a ServiceAccount with a real token (TokenRequest)."""
    token = kubectl(cluster, "create", "token", name, "-n", namespace, "--duration", "1h")
    config = json.loads(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token.strip()}
    path = tmp / f"{name}.kubeconfig"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


class Pod:
    """The installed Deployment's pod as containers: the plugin sidecar and orchestrators."""

    def __init__(self, cluster: KubeCluster, image: str, tmp: Path, containers: Containers):
        self.cluster, self.tmp, self.containers = cluster, tmp, containers
        self.deployment = _deployment()
        self.orchestrator = _container(self.deployment, "orchestrator")
        self.sidecar = _container(self.deployment, "plugin-sim")
        # The default install runs exactly the image `make image` built.
        assert self.orchestrator["image"] == image and self.sidecar["image"] == image
        self.service_account = _service_account_dir(
            cluster, tmp, self.deployment["metadata"]["namespace"], SA_NAME
        )
        self.sim_port = 0
        self.sim_dir = tmp / "sim"

    def start_sim(self, fleet: dict[str, Any]) -> None:
        """The plugin sidecar's command on a test fleet (fast steps) instead of --generate."""
        (self.sim_dir / "out").mkdir(parents=True)
        (self.sim_dir / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        (self.sim_dir / "out").chmod(0o777)  # the image's user writes the monitor here
        self.sim_port = free_port()
        listen = self.sidecar["args"][self.sidecar["args"].index("--listen") + 1]
        assert listen.startswith("127.0.0.1:")  # loopback only, as shipped
        flags = [*_pod_flags(self.deployment, self.sidecar), "-v", f"{self.sim_dir}:/sim"]
        self.containers.run(
            "plugin-sim",
            flags,
            self.sidecar["command"],
            [
                *("--listen", f"127.0.0.1:{self.sim_port}"),
                *("--fleet", "/sim/fleet.yaml", "--reload-interval", "0"),
                *("--monitor-file", "/sim/out/monitor.json", "--target-version", NEW),
            ],
        )
        wait_for("the sim serves", lambda: _accepts(self.sim_port), timeout=60, interval=0.2)

    def monitor(self) -> dict[str, Any]:
        return dict(json.loads((self.sim_dir / "out" / "monitor.json").read_text()))

    def start_orchestrator(self, replica: int) -> tuple[str, int]:
        """One replica, with the shipped command and args (metrics on a free loopback port)."""
        # Each pod has its own IP; on the host's network each replica needs its own ports.
        port = free_port()
        args = _with_flag(self.orchestrator["args"], "--metrics-addr", f"127.0.0.1:{port}")
        args = _with_flag(args, "--webhook-addr", f"127.0.0.1:{free_port()}")
        # Nothing but the in-cluster path: no kubeconfig named, none in the image (HOME=/tmp).
        assert not any(a.startswith("--kubeconfig") for a in args)
        assert "KUBECONFIG" not in {e["name"] for e in self.orchestrator.get("env", [])}
        host, apiserver_port = self.cluster.url.removeprefix("https://").rsplit(":", 1)
        flags = [
            *_pod_flags(self.deployment, self.orchestrator),
            "-v",
            f"{self.service_account}:{TOKEN_DIR}:ro",
            "-e",
            f"KUBERNETES_SERVICE_HOST={host}",
            "-e",
            f"KUBERNETES_SERVICE_PORT={apiserver_port}",
        ]
        name = self.containers.run(
            f"orchestrator-{replica}", flags, self.orchestrator["command"], args
        )
        return name, port


def _fleet(step_seconds: float) -> dict[str, Any]:
    """The three clusters of manifests/examples/original.yaml, at OLD."""
    (body,) = yaml_docs([ORIGINAL])
    pools = [{"name": "default-pool", "version": OLD}]
    return {
        "defaults": {
            "stepSeconds": {
                k: step_seconds for k in ("serviceOut", "serviceIn", "controlPlane", "nodePool")
            },
            "jitter": 0,
        },
        "clusters": [
            {"id": c["id"], "controlPlaneVersion": OLD, "nodePools": pools}
            for c in body["spec"]["clusters"]
        ],
    }


def _leader(containers: Containers, names: list[str]) -> str | None:
    leaders = [n for n in names if "became leader" in containers.logs(n)]
    assert len(leaders) <= 1, leaders
    return leaders[0] if leaders else None


def test_two_replicas_complete_the_original_manifest_with_a_leader_hand_over(
    control_plane: KubeCluster, image: str, shipped_install: None, tmp_path: Path
) -> None:
    containers = Containers(image)
    with ExitStack() as stack:
        stack.callback(containers.remove_all)
        pod = Pod(control_plane, image, tmp_path, containers)
        pod.start_sim(_fleet(step_seconds=1.0))
        replicas = pod.deployment["spec"]["replicas"]
        assert replicas == 2
        started = [pod.start_orchestrator(i) for i in range(replicas)]
        names = [n for n, _ in started]
        for name, port in started:
            # /readyz: the leader once its caches synced, a standby at once; /healthz: alive.
            wait_for(
                f"{name} /readyz",
                lambda p=port: _get(f"http://127.0.0.1:{p}/readyz")[0] == 200,
                timeout=90,
                interval=0.5,
            )
            assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        first = wait_for("a leader", lambda: _leader(containers, names), timeout=60)
        (standby,) = [n for n in names if n != first]

        (body,) = yaml_docs([ORIGINAL])
        body["spec"]["opsEndpoint"]["endpoint"] = f"localhost:{pod.sim_port}"
        kubectl(control_plane, "apply", "-n", HOME, "-f", "-", stdin=yaml.safe_dump(body))
        name = body["metadata"]["name"]
        cvs = CV(control_plane, HOME)

        def one_upgraded() -> bool:
            return any(
                (o.get("status") or {}).get("phase") == api.UpgradePhase.UPGRADED.value
                for o in cvs.upgrades(name).values()
            )

        wait_for("the first cluster upgraded", one_upgraded, timeout=120, interval=0.5)
        assert cvs.status(name)["phase"] != "Completed", "too fast to hand over mid-rollout"
        # A rolling update or a drain: SIGTERM to the leader, which releases its Lease.
        began = time.monotonic()
        containers.stop(
            first,
            grace=int(pod.deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]),
        )
        assert containers.exit_code(first) == 0, containers.logs(first)[-3000:]
        assert "released the lease" in containers.logs(first)
        stopped = time.monotonic()
        wait_for(
            "the standby leads",
            lambda: "became leader" in containers.logs(standby),
            timeout=60,
            interval=0.5,
        )
        print(
            f"hand-over: leader stopped in {stopped - began:.1f}s, "
            f"standby leading {time.monotonic() - stopped:.1f}s later"
        )
        done = wait_for(
            "the rollout completes",
            lambda: cvs.phase_is(name, "Completed"),
            timeout=180,
            interval=0.5,
        )
        assert done["summary"]["upToDate"] == 3
        m = pod.monitor()
        assert m["clusters_by_version"] == {NEW: 3}
        assert m["clusters_at_target"] == 3
        assert m["duplicate_mutations"] == 0
        assert m["min_available_in_service"] >= body["spec"]["requiredAvailableCount"]
        with control_plane.api_client() as client:
            lease = k8s.CoordinationV1Api(client).read_namespaced_lease(LEASE, HOME)
        assert lease.spec.holder_identity in containers.logs(standby)
        for container in names:
            text = containers.logs(container)
            assert "forbidden" not in text.lower(), text[-3000:]
            assert "Traceback" not in text, text[-3000:]


def test_a_namespace_editor_cannot_point_the_orchestrator_at_a_plugin(
    control_plane: KubeCluster, image: str, shipped_install: None, namespace: str, tmp_path: Path
) -> None:
    kubectl(control_plane, "-n", namespace, "create", "serviceaccount", "editor")
    kubectl(
        control_plane,
        *("-n", namespace, "create", "rolebinding", "editor-edit"),
        *("--clusterrole", "edit", "--serviceaccount", f"{namespace}:editor"),
    )
    editor = _user_kubeconfig(control_plane, tmp_path, namespace, "editor")
    containers = Containers(image)
    with ExitStack() as stack:
        stack.callback(containers.remove_all)
        pod = Pod(control_plane, image, tmp_path, containers)
        pod.start_sim(_fleet(step_seconds=0.2))
        name, port = pod.start_orchestrator(0)
        wait_for(
            "/readyz",
            lambda: _get(f"http://127.0.0.1:{port}/readyz")[0] == 200,
            timeout=90,
            interval=0.5,
        )
        (body,) = yaml_docs([ORIGINAL])
        body["spec"]["opsEndpoint"]["endpoint"] = f"localhost:{pod.sim_port}"
        manifest = yaml.safe_dump(body)

        def as_editor(*args: str, stdin: str | None = None) -> tuple[int, str]:
            done = subprocess.run(
                ["kubectl", "--kubeconfig", str(editor), *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            return done.returncode, done.stdout + done.stderr

        # Nothing is aggregated into the built-in roles: `edit` alone cannot create one.
        code, out = as_editor("apply", "-n", namespace, "-f", "-", stdin=manifest)
        assert code != 0 and "forbidden" in out.lower(), out
        # Nor declare a provider of its own (cluster-scoped, platform admins only).
        for verb, resource in (("create", "fleetproviders"), ("create", "metricsources")):
            code, out = as_editor("auth", "can-i", verb, f"{resource}.{api.GROUP}", "-A")
            assert out.strip() == "no", (resource, out)
        # Granted the ClusterVersion editor role in its namespace (what an admin binds, or the
        # aggregate-to-builtin-roles overlay gives `edit`: no aggregation controller runs here).
        kubectl(
            control_plane,
            *("-n", namespace, "create", "rolebinding", "editor-clusterversions"),
            *("--clusterrole", "fleet-clusterversion-editor"),
            *("--serviceaccount", f"{namespace}:editor"),
        )

        def editor_applies() -> bool:
            code, _out = as_editor("apply", "-n", namespace, "-f", "-", stdin=manifest)
            return code == 0

        wait_for("the editor may create ClusterVersions", editor_applies, timeout=30, interval=0.5)
        cvs = CV(control_plane, namespace)
        status = wait_for(
            "refused as Invalid",
            lambda: cvs.phase_is(body["metadata"]["name"], "Invalid"),
            timeout=60,
            interval=0.5,
        )
        assert "spec.opsEndpoint" in status["message"], status["message"]
        assert f"--allow-inline-endpoints-in={namespace}" in status["message"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        custom = k8s.CustomObjectsApi(control_plane.api_client())
        for plural in (api.UPDATE_RUN_PLURAL, api.CLUSTER_UPGRADE_PLURAL):
            items = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, plural)
            assert items["items"] == [], plural
        m = pod.monitor()
        assert m["mutations_total"] == 0 and m["mutating_callers"] == 0, m
        assert m["clusters_by_version"] == {OLD: 3}
        assert containers.running(name)
        text = containers.logs(name)
        assert "forbidden" not in text.lower(), text[-3000:]
