"""The fleet file: shipped examples load, generated fleets, and errors that name the field."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from plugins.sim.config import (
    ConfigError,
    GenerateSpec,
    generate_clusters,
    load_fleet_file,
    parse_fleet,
)
from plugins.sim.health import render_query

EXAMPLES = Path(__file__).resolve().parents[3] / "plugins" / "sim" / "examples"


def test_the_small_example_has_twelve_clusters_in_three_stages() -> None:
    config = load_fleet_file(EXAMPLES / "small-fleet.yaml")
    clusters = config.all_clusters()
    assert len(clusters) == 12
    assert Counter(c.labels["stage"] for c in clusters) == {"canary": 2, "early": 4, "main": 6}
    assert {c.control_plane_version for c in clusters} == {"1.28.5"}
    assert all(len(c.node_pools) == 2 for c in clusters)
    assert len(config.defaults.workloads) == 2


def test_the_twenty_cluster_example() -> None:
    clusters = load_fleet_file(EXAMPLES / "fleet-20.yaml").all_clusters()
    assert len(clusters) == 20
    stages = Counter(c.labels["stage"] for c in clusters)
    assert stages == {"canary": 2, "wave1": 6, "wave2": 6, "wave3": 6}


def test_the_faults_example_uses_every_fault() -> None:
    config = load_fleet_file(EXAMPLES / "faults.yaml")
    faults = config.faults
    assert faults.fail_step and faults.unhealthy_after_upgrade and faults.availability_flaps
    assert faults.unavailable_rate > 0 and faults.hang_rpc
    unused = [name for name in type(faults).model_fields if not getattr(faults, name)]
    assert unused == ["unavailable_methods"]  # empty on purpose: every RPC may be UNAVAILABLE
    assert any(c.maintenance_windows for c in config.clusters)


def test_generated_fleet_of_ten_thousand() -> None:
    clusters = generate_clusters(GenerateSpec(count=10_000))
    ids = [c.id for c in clusters]
    assert ids[0] == "cluster-00001" and ids[-1] == "cluster-10000"
    assert len(set(ids)) == 10_000
    assert Counter(c.labels["stage"] for c in clusters) == {
        "canary": 200,
        "early": 1800,
        "main": 8000,
    }
    assert set(Counter(c.labels["region"] for c in clusters).values()) == {2500}
    first = clusters[0]
    assert first.control_plane_version == "1.28.5"
    assert [(p.name, p.version) for p in first.node_pools] == [
        ("default-pool", "1.28.5"),
        ("workers", "1.28.5"),
    ]


def test_small_generated_fleets_have_every_stage() -> None:
    clusters = generate_clusters(GenerateSpec(count=3, node_pool_version="1.27.3"))
    assert [c.labels["stage"] for c in clusters] == ["canary", "early", "main"]
    assert {p.version for c in clusters for p in c.node_pools} == {"1.27.3"}


def test_generate_and_clusters_combine() -> None:
    config = parse_fleet(
        {"generate": {"count": 2}, "clusters": [{"id": "extra", "controlPlaneVersion": "1.29"}]}
    )
    assert [c.id for c in config.all_clusters()] == ["cluster-00001", "cluster-00002", "extra"]


def _one(**fields: Any) -> dict[str, Any]:
    return {"id": "a", "controlPlaneVersion": "1.28.5", **fields}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "clusters: list at least one cluster, or set generate.count"),
        (
            {"clusters": [_one(), _one()]},
            "clusters[1].id: 'a' is used twice; ids must be unique",
        ),
        (
            {"clusters": [_one(controlPlaneVersion="banana")]},
            "clusters[0].controlPlaneVersion: 'banana' is not a version; write it like 1.29.4",
        ),
        (
            {"clusters": [_one(nodePools=[{"name": "p", "version": "1.28.5"}] * 2)]},
            "clusters[0].nodePools[1].name: 'p' appears twice",
        ),
        (
            {"clusters": [_one(colour="blue")]},
            "clusters[0].colour: unknown field; remove it or check its spelling",
        ),
        (
            {"clusters": [_one()], "faults": {"failStep": [{"step": "cp", "clusters": ["a"]}]}},
            "faults.failStep[0].step: Input should be 'serviceOut', 'serviceIn', "
            "'controlPlane' or 'nodePool'",
        ),
        (
            {
                "clusters": [_one()],
                "faults": {"availabilityFlaps": [{"clusters": ["a", "zz"], "period": 1}]},
            },
            "faults.availabilityFlaps[0].clusters: unknown cluster id(s) zz; use ids from clusters",
        ),
        (
            {"clusters": [_one()], "defaults": {"jitter": 1.5}},
            "defaults.jitter: Input should be less than 1",
        ),
        (
            {"clusters": [_one()], "faults": {"unavailableRate": 2}},
            "faults.unavailableRate: Input should be less than or equal to 1",
        ),
        (
            {"clusters": [_one(workloads=[{"namespace": "n", "name": "w", "health": "bad"}])]},
            "clusters[0].workloads[0].health",
        ),
        ({"generate": {"count": 0}}, "generate.count: Input should be greater than or equal to 1"),
        (
            {"clusters": [_one()], "faults": {"hangRpc": [{"method": "GetClustr", "seconds": 1}]}},
            "faults.hangRpc[0].method: 'GetClustr' is not a ClusterService or HealthService RPC",
        ),
        (
            {"clusters": [_one()], "faults": {"unavailableMethods": ["ListGates"]}},
            "faults.unavailableMethods[0]: 'ListGates' is not a ClusterService or HealthService",
        ),
    ],
)
def test_invalid_fleet_files_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet(data, "fleet.yaml")
    assert str(err.value).startswith("fleet.yaml: ")
    assert message in str(err.value)


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--fleet: cannot read"):
        load_fleet_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_fleet_file(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_fleet_file(listed)


def test_render_query_fills_known_placeholders_only() -> None:
    template = 'rate(x{cluster="{{cluster}}",stage="{{ stage }}",z="{{unknown}}"}[5m])'
    assert render_query(template, {"cluster": "c1", "stage": "canary"}) == (
        'rate(x{cluster="c1",stage="canary",z="{{unknown}}"}[5m])'
    )
