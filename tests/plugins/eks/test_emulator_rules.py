"""The EKS emulator refuses what EKS refuses, driven by boto3 alone (no plugin): so the
plugin's own checks are tested against rules, not against themselves."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.plugins.eks.support import NEW, NEXT, OLD, REGION
from tests.support.eks_emulator import EksEmulator
from tests.support.plugin_harness import wait_until


def _eks(emulator: EksEmulator, region: str = REGION) -> Any:
    return boto3.client(
        "eks",
        region_name=region,
        endpoint_url=emulator.endpoint,
        config=boto3.session.Config(retries={"total_max_attempts": 1}),
    )


def _refused(call: Any, code: str, status: int) -> str:
    with pytest.raises(ClientError) as err:
        call()
    assert err.value.response["Error"]["Code"] == code
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    return str(err.value.response["Error"]["Message"])


def test_version_offers_and_one_minor_at_a_time(emulator: EksEmulator) -> None:
    eks = _eks(emulator)
    offered = [v["clusterVersion"] for v in eks.describe_cluster_versions()["clusterVersions"]]
    assert offered == [OLD, NEW, NEXT]  # 1.28 is unsupported: listed only with includeAll
    every = eks.describe_cluster_versions(includeAll=True)["clusterVersions"]
    assert {v["clusterVersion"]: v["status"] for v in every}["1.28"] == "unsupported"
    bad = "InvalidParameterException"
    _refused(lambda: eks.update_cluster_version(name="c1", version=NEXT), bad, 400)
    _refused(lambda: eks.update_cluster_version(name="c1", version="1.28"), bad, 400)
    _refused(lambda: eks.update_cluster_version(name="c1", version=OLD), bad, 400)
    _refused(lambda: eks.update_cluster_version(name="c1", version="1.40"), bad, 400)
    _refused(
        lambda: eks.update_nodegroup_version(
            clusterName="c1", nodegroupName="workers", version=NEW
        ),
        bad,
        400,
    )
    _refused(lambda: eks.describe_cluster(name="gone"), "ResourceNotFoundException", 404)
    assert emulator.cluster(REGION, "c1")["updates"] == []


def test_one_update_at_a_time_per_cluster_and_token_idempotency(emulator: EksEmulator) -> None:
    emulator.held = True
    eks = _eks(emulator)
    first = eks.update_cluster_version(name="c1", version=NEW, clientRequestToken="t1")["update"]
    assert first["status"] == "InProgress" and first["type"] == "VersionUpdate"
    assert first["params"] == [{"type": "Version", "value": NEW}]
    # The same token returns the same update, and starts nothing.
    again = eks.update_cluster_version(name="c1", version=NEW, clientRequestToken="t1")["update"]
    assert again["id"] == first["id"]
    busy = "ResourceInUseException"
    _refused(
        lambda: eks.update_cluster_version(name="c1", version=NEW, clientRequestToken="t2"),
        busy,
        409,
    )
    _refused(
        lambda: eks.update_nodegroup_version(
            clusterName="c1", nodegroupName="system", clientRequestToken="t3"
        ),
        busy,
        409,
    )
    assert eks.describe_cluster(name="c1")["cluster"]["status"] == "UPDATING"
    assert eks.list_updates(name="c1")["updateIds"] == [first["id"]]
    emulator.held = False
    # Progress over time: InProgress, then Successful with the version applied.
    done = wait_until(
        lambda: (
            (u := eks.describe_update(name="c1", updateId=first["id"])["update"])["status"]
            == "Successful"
            and u
        ),
        what="the update succeeds",
    )
    assert done["errors"] == []
    cluster = eks.describe_cluster(name="c1")["cluster"]
    assert (cluster["version"], cluster["status"]) == (NEW, "ACTIVE")
    # Node groups default to the cluster's version.
    ng = eks.update_nodegroup_version(clusterName="c1", nodegroupName="system")["update"]
    assert ng["params"] == [{"type": "Version", "value": NEW}]
    _refused(
        lambda: eks.describe_update(name="c1", updateId=ng["id"]), "ResourceNotFoundException", 404
    )
    assert (
        eks.describe_update(name="c1", updateId=ng["id"], nodegroupName="system")["update"]["id"]
        == ng["id"]
    )
    # Node groups must match the cluster before the next control-plane upgrade.
    wait_until(
        lambda: (
            eks.describe_update(name="c1", updateId=ng["id"], nodegroupName="system")["update"][
                "status"
            ]
            == "Successful"
        ),
        what="the node group update succeeds",
    )
    _refused(
        lambda: eks.update_cluster_version(name="c1", version=NEXT), "InvalidRequestException", 400
    )


def test_throttling_and_transient_5xx_injection(emulator: EksEmulator) -> None:
    eks = _eks(emulator)
    for fault, status in [
        ("ThrottlingException", 429),
        ("ServerException", 500),
        ("ServiceUnavailableException", 503),
    ]:
        emulator.inject("ListClusters", fault)
        _refused(eks.list_clusters, fault, status)
        assert eks.list_clusters()["clusters"] == ["c1", "c2", "c3", "c4"]


def test_node_group_health_issues_and_failed_updates(emulator: EksEmulator) -> None:
    eks = _eks(emulator)
    emulator.set_nodegroup_issues(REGION, "c2", "workers", [("Ec2SubnetNotFound", "subnet gone")])
    ng = eks.describe_nodegroup(clusterName="c2", nodegroupName="workers")["nodegroup"]
    assert ng["status"] == "DEGRADED"
    assert ng["health"]["issues"][0]["code"] == "Ec2SubnetNotFound"
    _refused(
        lambda: eks.update_nodegroup_version(clusterName="c2", nodegroupName="workers"),
        "InvalidRequestException",
        400,
    )
    emulator.fail_next_update(REGION, "c2", error_code="ClusterUnreachable", message="no route")
    update = eks.update_cluster_version(name="c2", version=NEW)["update"]
    failed = wait_until(
        lambda: (
            (u := eks.describe_update(name="c2", updateId=update["id"])["update"])["status"]
            == "Failed"
            and u
        ),
        what="the update fails",
    )
    assert failed["errors"][0]["errorCode"] == "ClusterUnreachable"
    assert eks.describe_cluster(name="c2")["cluster"]["version"] == OLD


def test_upgrade_insights_block_the_target_unless_forced(emulator: EksEmulator) -> None:
    eks = _eks(emulator)
    blocking = emulator.add_insight(REGION, "c3", NEW, "ERROR", "removed APIs in use", "APIs")
    emulator.add_insight(REGION, "c3", NEW, "PASSING", "fine", "Kubelet skew")
    found = eks.list_insights(
        clusterName="c3",
        filter={
            "categories": ["UPGRADE_READINESS"],
            "kubernetesVersions": [NEW],
            "statuses": ["ERROR"],
        },
    )["insights"]
    assert [i["id"] for i in found] == [blocking]
    insight = eks.describe_insight(clusterName="c3", id=blocking)["insight"]
    assert insight["insightStatus"] == {"status": "ERROR", "reason": "removed APIs in use"}
    _refused(
        lambda: eks.update_cluster_version(name="c3", version=NEW), "InvalidStateException", 400
    )
    forced = eks.update_cluster_version(name="c3", version=NEW, force=True)["update"]
    assert forced["status"] == "InProgress"


def test_a_cluster_lives_in_one_region(emulator: EksEmulator) -> None:
    assert _eks(emulator, "eu-west-1").list_clusters()["clusters"] == []
    _refused(
        lambda: _eks(emulator, "eu-west-1").describe_cluster(name="c1"),
        "ResourceNotFoundException",
        404,
    )
