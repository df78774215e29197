"""The configuration file: safe defaults, errors that name the field and the fix, and
credentials that never come from the file."""

from __future__ import annotations

from typing import Any

import pytest

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.aks import ConfigError, capabilities, parse_config
from plugins.aks.api import build_credential

CID = (
    "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/"
    "Microsoft.ContainerService/managedClusters/web"
)


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "aks.yaml")
    return str(err.value)


def test_a_minimal_configuration_gets_safe_defaults() -> None:
    config = parse_config({"clusters": {"ids": [CID]}})
    assert config.api.endpoint == "https://management.azure.com"
    assert config.api.credentials == "workloadIdentity" and config.api.retries == 0
    assert config.traffic.mode == "unsupported"
    assert not config.upgrades.node_image_when_current
    assert config.operations.state_file == ""
    caps = capabilities(config)
    assert identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE not in caps
    assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS not in caps
    durable = parse_config(
        {"clusters": {"ids": [CID]}, "operations": {"stateFile": "/var/run/aks/ops.jsonl"}}
    )
    assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS in capabilities(durable)


def test_ids_are_kept_in_one_spelling() -> None:
    config = parse_config({"clusters": {"ids": [CID.replace("rg", "RG").replace("web", "Web")]}})
    assert config.clusters.ids == [CID]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({}, "clusters: is required"),
        ({"clusters": {}}, "clusters: needs ids or discover"),
        ({"clusters": {"ids": ["web"]}}, "clusters.ids[0] 'web' is not an AKS cluster resource id"),
        ({"clusters": {"ids": [CID, CID.upper()]}}, "clusters.ids: lists a cluster twice"),
        (
            {"clusters": {"discover": [{"subscription": "a/b"}]}},
            "clusters.discover[0].subscription: must be a subscription id",
        ),
        (
            {"clusters": {"ids": [CID]}, "api": {"endpoint": "http://127.0.0.1:8080"}},
            "api.endpoint: must be an https:// URL",
        ),
        (
            {"clusters": {"ids": [CID]}, "api": {"credentials": "clientSecret"}},
            "api.credentials",
        ),
        (
            {"clusters": {"ids": [CID]}, "api": {"clientSecret": "s3cr3t"}},
            "api.clientSecret: unknown field",
        ),
        ({"clusters": {"ids": [CID]}, "traffic": {"mode": "frontDoor"}}, "traffic.mode"),
    ],
)
def test_errors_name_the_field(data: Any, needle: str) -> None:
    message = _error(data)
    assert needle in message
    assert "s3cr3t" not in message


def test_workload_identity_without_its_environment_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    config = parse_config({"clusters": {"ids": [CID]}})
    with pytest.raises(ConfigError) as err:
        build_credential(config.api)
    assert "AZURE_FEDERATED_TOKEN_FILE" in str(err.value)
    assert "azure.workload.identity/client-id" in str(err.value)
