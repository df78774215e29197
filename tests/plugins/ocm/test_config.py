"""The configuration file: defaults, and errors that name the field and say the fix."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from plugins.ocm.config import (
    DEFAULT_TAINT_KEY,
    DEFAULT_TAINT_VALUE,
    ConfigError,
    load_config,
    parse_config,
    parse_duration,
)
from tests.plugins.ocm.conftest import PLAN_FEEDBACK, PLAN_TEMPLATE, curator_config, work_config


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    return str(err.value)


def test_minimal_curator_config_has_the_documented_defaults() -> None:
    cfg = parse_config({"upgradeMethod": "ClusterCurator"})
    assert cfg.monitor_timeout == timedelta(minutes=120)
    assert cfg.monitor_timeout_minutes == 120
    assert (cfg.taint.key, cfg.taint.value) == (DEFAULT_TAINT_KEY, DEFAULT_TAINT_VALUE)
    assert cfg.workloads.manifest_work_name == "fleetupgrade-health"
    assert cfg.workloads.feedback == "WellKnownStatus"
    # ClusterCurator upgrades to an OpenShift version: the OpenShift version claim by default.
    assert cfg.version_source == "clusterClaim:version.openshift.io"
    assert cfg.manifest_work is None
    assert parse_config(work_config()).version_source == "kubernetes"


@pytest.mark.parametrize(
    "source", ["kubernetes", "clusterClaim:kubeversion.open-cluster-management.io"]
)
def test_a_curator_config_comparing_kubernetes_versions_is_refused_naming_the_fix(
    source: str,
) -> None:
    """status.version.kubernetes on OpenShift is v1.27.6+b49f9d1 while desiredUpdate is
    4.14.10: the pair can never match, so every curated upgrade would time out."""
    message = _error(curator_config(versionSource=source))
    assert f"versionSource: {source} reports the Kubernetes version" in message, message
    assert "use versionSource: clusterClaim:version.openshift.io" in message, message
    assert parse_config(work_config(versionSource=source)).version_source == source


def test_manifest_work_config_accepts_the_template_as_yaml_text() -> None:
    import yaml

    data = work_config()
    data["manifestWork"]["template"] = yaml.safe_dump(PLAN_TEMPLATE)
    cfg = parse_config(data)
    assert cfg.manifest_work is not None
    assert cfg.manifest_work.template == PLAN_TEMPLATE
    assert cfg.manifest_work.name == "fleetupgrade-upgrade"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (120, timedelta(minutes=120)),
        (1.5, timedelta(seconds=90)),
        ("90s", timedelta(seconds=90)),
        ("1h30m", timedelta(minutes=90)),
        ("2h", timedelta(hours=2)),
    ],
)
def test_durations_are_minutes_or_go_style(value: int | float | str, expected: timedelta) -> None:
    assert parse_duration(value) == expected


def test_monitor_timeout_rounds_up_to_curator_minutes() -> None:
    assert parse_config(curator_config(monitorTimeout="90s")).monitor_timeout_minutes == 2
    assert parse_config(curator_config(monitorTimeout="5s")).monitor_timeout_minutes == 1


@pytest.mark.parametrize(
    ("data", "field", "hint"),
    [
        ({"upgradeMethod": "Ansible"}, "upgradeMethod", "ClusterCurator"),
        ({}, "upgradeMethod", "missing"),
        ({"upgradeMethod": "ManifestWork"}, "manifestWork", "required when upgradeMethod"),
        (curator_config(monitorTimeout="soon"), "monitorTimeout", "120m"),
        (curator_config(monitorTimeout=0), "monitorTimeout", "positive"),
        (
            curator_config(clusterCurator={"hostedClusters": "yes"}),
            "clusterCurator.hostedClusters",
            "'Refuse' or 'HostedClusterNamespace'",
        ),
        (curator_config(taint={"key": "Not A Key!"}), "taint.key", "qualified name"),
        (
            curator_config(taint={"key": "cluster.open-cluster-management.io/unavailable"}),
            "taint.key",
            "reserved",
        ),
        (curator_config(taint={"value": ""}), "taint.value", "never removes a taint"),
        (curator_config(versionSource="openshift"), "versionSource", "clusterClaim:<name>"),
        (curator_config(workloads={"feedback": "Magic"}), "workloads.feedback", "WellKnownStatus"),
        (curator_config(clusterCurator={"chanel": "x"}), "clusterCurator.chanel", "unknown field"),
    ],
)
def test_bad_fields_are_named_with_the_fix(data: dict[str, Any], field: str, hint: str) -> None:
    message = _error(data)
    assert f"{field}:" in message or f"{field}." in message, message
    assert hint in message, message


def test_manifest_work_template_needs_kind_and_name() -> None:
    data = work_config()
    data["manifestWork"]["template"] = {"apiVersion": "v1", "metadata": {}}
    message = _error(data)
    assert "manifestWork.template:" in message
    assert "kind" in message and "metadata.name" in message


def test_unknown_placeholders_are_refused() -> None:
    data = work_config()
    data["manifestWork"]["template"] = {**PLAN_TEMPLATE, "spec": {"version": "{{release}}"}}
    message = _error(data)
    assert "manifestWork.template:" in message and "release" in message


def test_feedback_rules_must_name_existing_json_paths() -> None:
    data = work_config()
    data["manifestWork"]["feedback"] = {**PLAN_FEEDBACK, "succeeded": {"name": "done", "value": 1}}
    message = _error(data)
    assert "manifestWork.feedback.succeeded.name:" in message
    assert "'done' is not one of the jsonPaths names" in message


def test_feedback_paths_start_at_the_object() -> None:
    data = work_config()
    data["manifestWork"]["feedback"] = {
        **PLAN_FEEDBACK,
        "jsonPaths": [{"name": "complete", "path": "status.ready"}],
        "failed": None,
        "message": None,
    }
    message = _error(data)
    assert "manifestWork.feedback.jsonPaths[0].path:" in message


def test_manifest_work_resource_must_be_a_plural_name() -> None:
    data = work_config()
    data["manifestWork"]["resource"] = "Plan"
    assert "manifestWork.resource:" in _error(data)


def test_load_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config: cannot read"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("upgradeMethod: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("upgradeMethod: ClusterCurator\nmonitorTimeout: later\n")
    with pytest.raises(ConfigError, match=r"wrong\.yaml: monitorTimeout:"):
        load_config(wrong)
