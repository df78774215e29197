"""The GKE emulator refuses what GKE and Compute refuse, driven by the official clients alone
(no plugin): so the plugin's own checks are tested against rules, not against themselves."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, container_v1

from tests.plugins.gke.support import NEG, NEW, NEWER, NEXT_MINOR, OLD, PROJECT, cluster_id
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_until

C1 = cluster_id("c1")


def _container(emulator: GkeEmulator) -> container_v1.ClusterManagerClient:
    return container_v1.ClusterManagerClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options={"api_endpoint": emulator.endpoint},
    )


def _refused(call: Callable[[], object], *needles: str) -> str:
    with pytest.raises(gexc.BadRequest) as err:
        call()
    for needle in needles:
        assert needle in err.value.message, err.value.message
    return str(err.value.message)


def test_gke_version_rules(emulator: GkeEmulator) -> None:
    gke = _container(emulator)
    emulator.set_server_config(
        PROJECT,
        "l",
        master_versions=[OLD, NEW, NEWER, NEXT_MINOR, "1.27.8-gke.1067004"],
        channels={"REGULAR": [OLD, NEW]},
    )
    auto = emulator.add_cluster(
        cluster_id("auto"), master_version=OLD, autopilot=True, node_pools=[{"name": "np"}]
    )
    skewed = emulator.add_cluster(
        cluster_id("skewed"),
        master_version=NEWER,
        node_pools=[{"name": "old", "version": "1.27.8-gke.1067004"}],
    )
    _refused(lambda: gke.update_master(name=C1, master_version="1.31"), "unsupported")
    _refused(lambda: gke.update_master(name=C1, master_version=NEXT_MINOR), "one minor version")
    _refused(lambda: gke.update_master(name=skewed, master_version=NEXT_MINOR), "node pool old")
    _refused(
        lambda: gke.update_node_pool(
            request={
                "name": f"{auto}/nodePools/np",
                "node_version": OLD,
                "image_type": "COS_CONTAINERD",
            }
        ),
        "Autopilot",
    )
    _refused(
        lambda: gke.update_node_pool(
            request={
                "name": f"{C1}/nodePools/default-pool",
                "node_version": NEW,
                "image_type": "COS_CONTAINERD",
            }
        ),
        "must not be newer than the master",
    )
    op = gke.update_master(name=C1, master_version="1.29")  # an alias: the highest 1.29
    assert emulator.operations(C1)[-1]["name"] == op.name
    message = _refused(lambda: gke.update_master(name=C1, master_version=NEW), "incompatible")
    assert op.name in message


def test_gke_busy_answer_has_the_documented_shape(emulator: GkeEmulator) -> None:
    op = emulator.start_foreign_operation(C1, "UPGRADE_MASTER", NEW)
    answer = requests.post(
        f"{emulator.endpoint}/v1/{C1}:updateMaster", json={"masterVersion": NEW}, timeout=5
    )
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["status"] == "FAILED_PRECONDITION"
    assert error["errors"][0]["reason"] == "failedPrecondition"
    assert error["message"] == f"Cluster is running incompatible operation {op.rsplit('/', 1)[1]}."


def test_compute_single_backend_and_merge_patch_rules(emulator: GkeEmulator) -> None:
    base = f"{emulator.endpoint}/compute/v1/projects/{PROJECT}/global/backendServices"
    emulator.add_backend_service(PROJECT, "solo", [{"group": NEG.format("c1")}])
    solo = requests.get(f"{base}/solo", timeout=5).json()
    solo["backends"][0]["capacityScaler"] = 0.0
    answer = requests.patch(
        f"{base}/solo",
        json={"backends": solo["backends"], "fingerprint": solo["fingerprint"]},
        timeout=5,
    )
    assert answer.status_code == 400 and "only one backend" in answer.text
    # A typed read-modify-write (the pinned client) loses a field newer than the client.
    emulator.add_backend_service(
        PROJECT, "hinted", [{"group": NEG.format(n), "futureBalancingHint": "x"} for n in "ab"]
    )
    typed = compute_v1.BackendServicesClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options={"api_endpoint": emulator.endpoint},
    )
    service = typed.get(project=PROJECT, backend_service="hinted")
    service.backends[0].capacity_scaler = 0.5
    typed.patch_unary(
        project=PROJECT,
        backend_service="hinted",
        backend_service_resource=compute_v1.BackendService(
            backends=list(service.backends), fingerprint=service.fingerprint
        ),
    )

    def applied() -> str | None:
        text = json.dumps(emulator.backend_service(PROJECT, "hinted"))
        return text if '"capacityScaler": 0.5' in text else None

    raw = wait_until(applied, what="patch applied")
    assert "futureBalancingHint" not in raw
