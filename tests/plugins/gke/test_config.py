"""The configuration file: defaults, and errors that name the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugins.gke import ConfigError, load_config, parse_config

CID = "projects/p/locations/us-central1/clusters/c1"
NEG = "projects/p/zones/us-central1-a/networkEndpointGroups/k8s1-web"


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "gke.yaml")
    return str(err.value)


def test_a_minimal_configuration_gets_safe_defaults() -> None:
    config = parse_config({"clusters": {"ids": [CID]}})
    assert config.traffic.mode == "none"
    assert config.api.credentials == "default" and config.api.container_endpoint == ""
    assert config.operations.poll_seconds == 5.0 and config.operations.state_file == ""
    # GKE lets manual upgrades through exclusions: refusing them is opt-in.
    assert not config.upgrades.respect_maintenance_exclusions


def test_a_full_configuration_parses() -> None:
    config = parse_config(
        {
            "clusters": {
                "ids": [CID],
                "discover": [{"project": "p", "location": "-", "matchLabels": {"fleet": "prod"}}],
            },
            "traffic": {
                "mode": "backendServices",
                "backendServices": [{"project": "p", "name": "web"}],
                "backends": {CID: [f"https://www.googleapis.com/compute/v1/{NEG}"]},
            },
            "operations": {"pollSeconds": 2, "stateFile": "/var/run/gke/state.json"},
        }
    )
    assert config.clusters.discover[0].match_labels == {"fleet": "prod"}
    assert config.traffic.backend_services[0].name == "web"


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        ({}, ["clusters: is required"]),
        ({"clusters": {}}, ["clusters: needs ids or discover"]),
        ({"clusters": {"ids": ["c1"]}}, ["clusters.ids[0] 'c1' is not a GKE cluster id"]),
        ({"clusters": {"ids": [CID, CID]}}, ["clusters.ids: lists a cluster twice"]),
        (
            {"clusters": {"discover": [{"project": "p/x", "location": "l"}]}},
            ["clusters.discover[0].project: must be a project id"],
        ),
        (
            {"clusters": {"ids": [CID]}, "traffic": {"mode": "backendServices"}},
            ["traffic.backendServices: must list at least one"],
        ),
        (
            {
                "clusters": {"ids": [CID]},
                "traffic": {
                    "mode": "backendServices",
                    "backendServices": [{"project": "p", "name": "Web_Service"}],
                    "backends": {CID: [NEG]},
                },
            },
            ["traffic.backendServices[0].name: must be a backend service name"],
        ),
        (
            {
                "clusters": {"ids": [CID]},
                "traffic": {
                    "mode": "backendServices",
                    "backendServices": [{"project": "p", "name": "web"}],
                    "backends": {CID: ["k8s1-web"]},
                },
            },
            ["traffic.backends[" + CID + "]: 'k8s1-web' is not a group URL"],
        ),
        (
            {"clusters": {"ids": [CID]}, "api": {"credentials": "anonymous"}},
            ["api.credentials: anonymous is only allowed with api.containerEndpoint"],
        ),
        (
            {"clusters": {"ids": [CID]}, "operations": {"pollSeconds": 0}},
            ["operations.pollSeconds: Input should be greater than 0"],
        ),
        ({"clusters": {"ids": [CID]}, "trafic": {}}, ["trafic: unknown field"]),
    ],
)
def test_errors_name_the_field(data: Any, needles: list[str]) -> None:
    message = _error(data)
    assert message.startswith("gke.yaml: ")
    for needle in needles:
        assert needle in message, message


def test_files_that_cannot_be_read_or_parsed_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--config: cannot read .*missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("clusters: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(listed)
