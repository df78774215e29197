"""Job hooks as the install's ServiceAccount (manifests/install/rbac.yaml applied for real): the
Job is created in the orchestrator's namespace; in a team namespace the apiserver refuses and
the hook fails saying which RoleBinding allows it; with the hook-jobs overlay's RoleBinding in
that namespace, it is created there too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from devtools.controlplane import REPO_ROOT
from orchestrator import api
from orchestrator.adapters.hooks import HookExecutor
from orchestrator.adapters.kube import KubeClient
from orchestrator.adapters.secrets import TLSResolver
from orchestrator.engine.decide import PRE_HOOK, HookObs, HookState, hook_id
from orchestrator.pipeline.driver import HookRequest
from tests.install.conftest import install_namespace  # noqa: F401  (a fixture)
from tests.install.test_rbac_live import _service_account_kubeconfig
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl

pytestmark = pytest.mark.kube

RBAC = REPO_ROOT / "manifests" / "install" / "rbac.yaml"
BINDING = REPO_ROOT / "manifests" / "overlays" / "hook-jobs" / "rolebinding.yaml"


@pytest.fixture
def as_orchestrator(
    control_plane: KubeCluster,
    install_namespace: str,  # noqa: F811
    tmp_path: Path,
) -> Iterator[KubeClient]:
    kubectl(control_plane, "apply", "-f", str(RBAC))
    path = _service_account_kubeconfig(control_plane, install_namespace, tmp_path / "sa.json")
    kube = KubeClient(str(path))
    try:
        yield kube
    finally:
        kube.close()
        kubectl(control_plane, "delete", "--ignore-not-found", "-f", str(RBAC))


def _request(admin: KubeClient, namespace: str, attempt: int) -> HookRequest:
    name = f"rollout-1-{attempt}"
    admin.create_object(
        api.CLUSTER_UPGRADE_PLURAL,
        namespace,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.CLUSTER_UPGRADE_KIND,
            "metadata": {"name": name},
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
    container = {"name": "hook", "image": "busybox"}
    template = {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    return HookRequest(
        run=f"{namespace}/rollout-1",
        run_uid="uid-9",
        upgrade=name,
        cluster_id="prod-east",
        kind=PRE_HOOK,
        id=hook_id("uid-9", f"{namespace}/prod-east", PRE_HOOK, attempt),
        attempt=attempt,
        hook=api.Hook.model_validate({"job": {"template": template}}),
        current_version="1.28.5",
        target_version="1.29.1",
        start_time=datetime.now(UTC),
    )


def test_job_hooks_run_where_the_rbac_allows_and_say_how_to_allow_elsewhere(
    control_plane: KubeCluster,
    install_namespace: str,  # noqa: F811
    namespace: str,
    as_orchestrator: KubeClient,
) -> None:
    admin = KubeClient(str(control_plane.kubeconfig))
    try:
        home = _request(admin, install_namespace, 0)
        team = _request(admin, namespace, 1)
        ex = HookExecutor(as_orchestrator, TLSResolver(as_orchestrator))
        ex.start(home)
        assert ex.observe(home) == HookObs(HookState.RUNNING)
        assert admin.get_job(install_namespace, home.id)["metadata"]["name"] == home.id
        ex.start(team)
        refused = ex.observe(team)
        assert refused == HookObs(
            HookState.FAILED,
            f"the orchestrator may not create Jobs in namespace {namespace}; bind the "
            "ClusterRole fleet-orchestrator-hook-jobs there (manifests/overlays/hook-jobs)",
        )
        binding = yaml.safe_load(BINDING.read_text())
        binding["metadata"]["namespace"] = namespace
        kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(binding))
        again = _request(admin, namespace, 2)
        fresh = HookExecutor(as_orchestrator, TLSResolver(as_orchestrator))

        def created() -> bool:
            fresh.start(again)  # the binding takes a moment to be in force
            return fresh.observe(again).state == HookState.RUNNING

        wait_for("the Job is created once the RoleBinding is in force", created, timeout=30)
        assert admin.get_job(namespace, again.id)["metadata"]["name"] == again.id
    finally:
        admin.close()
