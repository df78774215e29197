"""Issue 19, build item 4: what cannot work is refused, with the field and the fix.

Each rule is attacked through the paths every entry point uses: `parse_spec` + `validate_spec`
(the controllers, `plan`), `webhook.admit` (kubectl apply), and `pin_upgrades` over an
inventory (a run's start, the simulation, `plan`). The end-to-end tests on the real stack are
tests/e2e/test_admission.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from orchestrator import api
from orchestrator.adapters.webhook import admit
from orchestrator.api.crd import structural_schema
from orchestrator.engine.initialize import Pinned, pin_upgrades
from orchestrator.engine.observations import ClusterObs
from orchestrator.engine.validate import parse_spec, validate_spec
from orchestrator.pipeline.simulate import ModelFleet, simulate

NEW = "1.29.4"


def cv_spec(**extra: Any) -> dict[str, Any]:
    return {
        "requiredAvailableCount": 1,
        "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
        "clusters": [{"id": "a", "version": NEW}, {"id": "b", "version": NEW}],
        **extra,
    }


def problems(raw: dict[str, Any]) -> dict[str, str]:
    """Field → message, as the controllers and `plan` see a spec (parse, then validate)."""
    parsed = parse_spec(raw)
    found = parsed if isinstance(parsed, list) else validate_spec(parsed)
    return {p.field: p.message for p in found}


def admitted(kind: str, spec: dict[str, Any]) -> dict[str, str]:
    """Field → message, as the admission webhook answers kubectl apply."""
    request = {
        "uid": "u",
        "kind": {"group": api.GROUP, "version": api.VERSION, "kind": kind},
        "operation": "CREATE",
        "namespace": "team-a",
        "object": {"metadata": {"name": "x", "namespace": "team-a"}, "spec": spec},
    }
    return {p.field: p.message for p in admit(request)}


CHECKS = {
    "interval": "30s",
    "timeout": "15m",
    "checks": [{"name": "app", "workloads": {"items": [{"namespace": "d", "name": "app"}]}}],
}
WINDOW = {"start": "01:00", "duration": "4h"}
HTTP_HOOK = {"http": {"url": "http://hook/x"}}

#: (field path, the spec that sets it to VALUE, its minimum). Every duration field of the kinds.
DURATIONS: list[tuple[str, Any, str]] = [
    *(
        (f"spec.timeouts.{k}", lambda v, k=k: cv_spec(timeouts={k: v}), "2s")
        for k in ("serviceOut", "controlPlane", "nodePool", "serviceIn", "ready")
    ),
    (
        "spec.healthChecks.interval",
        lambda v: cv_spec(healthChecks={**CHECKS, "interval": v, "timeout": "1h"}),
        "100ms",
    ),
    (
        "spec.healthChecks.timeout",
        lambda v: cv_spec(healthChecks={**CHECKS, "successThreshold": 1, "timeout": v}),
        "1s",
    ),
    (
        "spec.strategy.stages[0].soakTime",
        lambda v: cv_spec(
            strategy={"stages": [{"name": "all", "clusters": ["a", "b"], "soakTime": v}]}
        ),
        "1s",
    ),
    (
        "spec.strategy.stages[0].healthChecks.interval",
        lambda v: cv_spec(
            strategy={
                "stages": [
                    {
                        "name": "all",
                        "clusters": ["a", "b"],
                        "healthChecks": {**CHECKS, "interval": v, "timeout": "1h"},
                    }
                ]
            }
        ),
        "100ms",
    ),
    (
        "spec.strategy.maintenance.windows[0].duration",
        lambda v: cv_spec(
            strategy={"maintenance": {"windows": [{**WINDOW, "duration": v}], "allowOverrun": True}}
        ),
        "1m",
    ),
    (
        "spec.strategy.maintenance.expectedDuration",
        lambda v: cv_spec(strategy={"maintenance": {"windows": [WINDOW], "expectedDuration": v}}),
        "1m",
    ),
    (
        "spec.strategy.hooks.preUpgrade.timeout",
        lambda v: cv_spec(strategy={"hooks": {"preUpgrade": {**HTTP_HOOK, "timeout": v}}}),
        "1s",
    ),
    (
        "spec.strategy.hooks.postUpgrade.http.timeout",
        lambda v: cv_spec(
            strategy={"hooks": {"postUpgrade": {"http": {"url": "http://h/x", "timeout": v}}}}
        ),
        "1s",
    ),
]
IDS = [d[0] for d in DURATIONS]


def _below(minimum: str) -> str:
    """A value a little under the minimum, written in another unit."""
    return {"2s": "1900ms", "1s": "999ms", "100ms": "99ms", "1m": "59s"}[minimum]


@pytest.mark.parametrize(("field", "spec", "minimum"), DURATIONS, ids=IDS)
def test_zero_negative_and_short_durations_are_refused_naming_the_field(
    field: str, spec: Any, minimum: str
) -> None:
    for value in ("0s", "0ms", "0h0m0s", _below(minimum)):
        got = problems(spec(value))
        assert set(got) == {field}, (value, got)
        assert got[field].startswith(f"{value} is too short"), got
        assert f"set it to {minimum} or more" in got[field], got
    for value in ("-5s", "-1m", "5", "1d"):
        got = problems(spec(value))
        assert set(got) == {field}, (value, got)
        assert "is not a duration; write a positive one" in got[field], got
    assert problems(spec(minimum)) == {}, minimum  # the minimum itself is fine


@pytest.mark.parametrize(("field", "spec", "minimum"), DURATIONS, ids=IDS)
def test_the_webhook_refuses_them_for_cluster_versions_and_update_runs(
    field: str, spec: Any, minimum: str
) -> None:
    raw = spec("0s")
    assert set(admitted(api.KIND, raw)) == {field}
    # A run created directly (no ClusterVersion) carries the same fields.
    assert set(admitted(api.UPDATE_RUN_KIND, raw)) == {field}
    assert admitted(api.UPDATE_RUN_KIND, spec(minimum)) == {}


def test_the_crd_schema_refuses_zero_and_negative_durations_by_pattern() -> None:
    """The apiserver itself (no webhook) refuses what the pattern can say: not positive."""
    schema = structural_schema(api.ClusterVersionSpec)
    timeouts = schema["properties"]["timeouts"]["properties"]
    pattern = timeouts["nodePool"]["pattern"]
    assert pattern == api.POSITIVE_DURATION_PATTERN
    window = schema["properties"]["strategy"]["properties"]["maintenance"]["properties"]
    assert window["expectedDuration"]["pattern"] == pattern
    for bad in ("0s", "0ms", "00.000s", "0h0m", "-5s", "", "5", "1.5"):
        assert not re.fullmatch(pattern, bad), bad
    for good in ("1ms", "0.5s", "0s1ms", "1h30m", "90m", "10s", "0.001h", "100ms"):
        assert re.fullmatch(pattern, good), good


def test_a_health_timeout_that_cannot_hold_success_threshold_passes_is_refused() -> None:
    # Passes come at 0, 1m, 2m: a 2m timeout fails the analysis before the third can count.
    tight = {**CHECKS, "interval": "1m", "successThreshold": 3, "timeout": "2m"}
    got = problems(cv_spec(healthChecks=tight))
    assert list(got) == ["spec.healthChecks.timeout"]
    assert "set it longer than 2m" in got["spec.healthChecks.timeout"]
    assert problems(cv_spec(healthChecks={**tight, "timeout": "2m30s"})) == {}
    assert problems(cv_spec(healthChecks={**tight, "successThreshold": 1, "timeout": "1s"})) == {}


# -- label selectors as Kubernetes validates them ------------------------------------------


def staged(selector: dict[str, Any]) -> dict[str, Any]:
    return cv_spec(
        clusters=None, version=NEW, strategy={"stages": [{"name": "s", "selector": selector}]}
    )


SEL = "spec.strategy.stages[0].selector"
REFUSED_SELECTORS = [
    ({"matchExpressions": [{"key": "ring", "operator": "In"}]}, "matchExpressions[0].values"),
    (
        {"matchExpressions": [{"key": "ring", "operator": "NotIn", "values": []}]},
        "matchExpressions[0].values",
    ),
    (
        {"matchExpressions": [{"key": "ring", "operator": "Exists", "values": ["a"]}]},
        "matchExpressions[0].values",
    ),
    (
        {"matchExpressions": [{"key": "ring", "operator": "DoesNotExist", "values": ["a"]}]},
        "matchExpressions[0].values",
    ),
    ({"matchExpressions": [{"key": "ring", "operator": "Equals"}]}, "matchExpressions[0].operator"),
    ({"matchExpressions": [{"key": "ring", "operator": "in"}]}, "matchExpressions[0].operator"),
    (
        {"matchExpressions": [{"key": "a b", "operator": "Exists"}]},
        "matchExpressions[0].key",
    ),
    (
        {"matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]},
        "matchExpressions[0].key",
    ),
    (
        {"matchExpressions": [{"key": "/ring", "operator": "Exists"}]},
        "matchExpressions[0].key",
    ),
    (
        {"matchExpressions": [{"key": "Example.com/ring", "operator": "Exists"}]},
        "matchExpressions[0].key",
    ),
    (
        {"matchExpressions": [{"key": "x" * 64, "operator": "Exists"}]},
        "matchExpressions[0].key",
    ),
    (
        {"matchExpressions": [{"key": f"{'a' * 254}/ring", "operator": "Exists"}]},
        "matchExpressions[0].key",
    ),
    (
        {"matchExpressions": [{"key": "ring", "operator": "In", "values": ["canary", "-x"]}]},
        "matchExpressions[0].values[1]",
    ),
    ({"matchLabels": {"ring": "can ary"}}, "matchLabels.ring"),
    ({"matchLabels": {"ring": "v" * 64}}, "matchLabels.ring"),
    ({"matchLabels": {"ring_": "x", "-ring": "x"}}, "matchLabels"),
]


@pytest.mark.parametrize(("selector", "where"), REFUSED_SELECTORS)
def test_selectors_kubernetes_would_reject_are_refused(
    selector: dict[str, Any], where: str
) -> None:
    field = f"{SEL}.{where}"
    assert set(problems(staged(selector))) == {field}
    assert set(admitted(api.KIND, staged(selector))) == {field}
    assert set(admitted(api.UPDATE_RUN_KIND, staged(selector))) == {field}


def test_in_without_values_says_what_to_do() -> None:
    got = problems(staged({"matchExpressions": [{"key": "ring", "operator": "In"}]}))
    message = got[f"{SEL}.matchExpressions[0].values"]
    assert "at least one value when operator is In" in message and "Exists" in message


def test_selectors_kubernetes_accepts_pass() -> None:
    for selector in (
        {},
        {"matchLabels": {"ring": "canary", "example.com/team": "blue", "empty": ""}},
        {"matchLabels": {"a" * 63: "b" * 63, f"{'p.' * 120}x/{'n' * 63}": "Z_9.z-1"}},
        {"matchExpressions": [{"key": "ring", "operator": "In", "values": ["a", ""]}]},
        {"matchExpressions": [{"key": "ring", "operator": "NotIn", "values": ["a"]}]},
        {"matchExpressions": [{"key": "ring", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "ring", "operator": "DoesNotExist", "values": []}]},
    ):
        assert problems(staged(selector)) == {}, selector


def test_the_crd_schema_carries_the_label_patterns() -> None:
    schema = structural_schema(api.ClusterVersionSpec)
    stage = schema["properties"]["strategy"]["properties"]["stages"]["items"]
    selector = stage["properties"]["selector"]["properties"]
    assert selector["matchLabels"]["additionalProperties"]["pattern"] == api.LABEL_VALUE_PATTERN
    requirement = selector["matchExpressions"]["items"]["properties"]
    assert requirement["key"]["pattern"] == api.LABEL_KEY_PATTERN
    assert requirement["values"]["items"]["pattern"] == api.LABEL_VALUE_PATTERN
    assert requirement["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist"]


# -- a stage that selects no cluster --------------------------------------------------------


def inventory() -> dict[str, ClusterObs]:
    rings = {"c0": "canary", "c1": "main", "c2": "main", "c3": "main"}
    return {cid: ClusterObs(cid, "1.28.5", labels={"ring": r}) for cid, r in rings.items()}


def run_spec(stages: list[dict[str, Any]], required: int = 2) -> api.UpdateRunSpec:
    return api.UpdateRunSpec.model_validate(
        {
            "requiredAvailableCount": required,
            "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
            "version": NEW,
            "strategy": {"stages": stages},
        }
    )


def test_a_stage_whose_selector_has_a_typo_makes_the_run_invalid_naming_it() -> None:
    spec = run_spec(
        [
            {"name": "canary", "selector": {"matchLabels": {"ring": "canery"}}},
            {"name": "main", "selector": {"matchLabels": {"ring": "main"}}},
        ]
    )
    pinned = pin_upgrades("r", spec, inventory())
    assert isinstance(pinned, list), "a run with an empty stage must not pin (nor complete)"
    (problem,) = pinned
    assert problem.field == "spec.strategy.stages[0]"
    assert "stage 'canary' selects no cluster" in problem.message
    assert '"canery"' in problem.message  # the selector as written, to spot the typo


def test_every_empty_stage_is_named_and_an_empty_cluster_list_counts() -> None:
    spec = run_spec(
        [
            {
                "name": "first",
                "selector": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
            },
            {"name": "second", "clusters": []},
            {"name": "rest", "selector": {"matchLabels": {"ring": "main"}}},
        ]
    )
    pinned = pin_upgrades("r", spec, inventory())
    assert isinstance(pinned, list)
    assert [(p.field, p.message.split(" selects")[0]) for p in pinned] == [
        ("spec.strategy.stages[0]", "stage 'first'"),
        ("spec.strategy.stages[1]", "stage 'second'"),
    ]


def test_stages_that_each_select_a_cluster_pin() -> None:
    spec = run_spec(
        [
            {"name": "canary", "selector": {"matchLabels": {"ring": "canary"}}},
            {"name": "main", "selector": {"matchLabels": {"ring": "main"}}},
        ]
    )
    pinned = pin_upgrades("r", spec, inventory())
    assert isinstance(pinned, Pinned)
    assert sorted(u.cluster_id for u in pinned.upgrades) == ["c0", "c1", "c2", "c3"]


def test_a_stage_that_only_overlaps_is_reported_as_overlapping_not_empty() -> None:
    spec = run_spec(
        [
            {"name": "all", "selector": {"matchLabels": {}}},
            {"name": "again", "clusters": ["c0"]},
        ]
    )
    pinned = pin_upgrades("r", spec, inventory())
    assert isinstance(pinned, list)
    assert [p.message for p in pinned if "selects no cluster" in p.message] == []
    assert any("stages must not overlap" in p.message for p in pinned)


def test_plan_reports_the_empty_stage_and_upgrades_nothing() -> None:
    fleet = ModelFleet(inventory())
    cv = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 2,
            "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
            "version": NEW,
            "strategy": {
                "stages": [
                    {"name": "main", "selector": {"matchLabels": {"ring": "main"}}},
                    {"name": "later", "selector": {"matchLabels": {"ring": "canari"}}},
                ]
            },
        }
    )
    outcome = simulate(fleet, cv)
    assert not outcome.settled and outcome.last is None
    assert len(outcome.problems) == 1 and outcome.problems[0].startswith(
        "spec.strategy.stages[1]: stage 'later' selects no cluster"
    )
    assert fleet.started_steps == []  # nothing was (even notionally) taken out
