"""A Job hook's template is checked when the spec is (webhook and controllers), not when the
first cluster's hook starts; every problem names the field and the fix."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.validate import parse_spec, validate_spec


def _problems(hooks: dict[str, Any]) -> dict[str, str]:
    """Every problem the webhook and the controllers find: parse, then validate."""
    spec = parse_spec(
        {
            "requiredAvailableCount": 1,
            "clusters": [{"id": "a", "version": "1.29.1"}, {"id": "b", "version": "1.29.1"}],
            "strategy": {"hooks": hooks},
        }
    )
    problems = spec if isinstance(spec, list) else validate_spec(spec)
    return {p.field: p.message for p in problems}


def _job(pod: dict[str, Any] | None) -> dict[str, Any]:
    return {"job": {"template": {} if pod is None else {"template": {"spec": pod}}}}


def test_a_good_job_template_and_an_http_hook_pass() -> None:
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
    assert (
        _problems({"preUpgrade": _job(pod), "postUpgrade": {"http": {"url": "http://h/x"}}}) == {}
    )


def test_job_templates_that_would_not_make_a_job_are_refused() -> None:
    at = "spec.strategy.hooks.{}.job.template.template.spec"
    assert _problems({"preUpgrade": _job(None)}) == {
        at.format("preUpgrade"): "is required: the Job's pod template (a JobSpec)"
    }
    found = _problems({"postUpgrade": _job({"containers": [{"image": "busybox"}]})})
    assert found == {
        at.format("postUpgrade") + ".containers": "every container needs a name",
        at.format("postUpgrade")
        + ".restartPolicy": "must be Never or OnFailure (a Job's pods end)",
    }
    found = _problems({"postUpgrade": _job({"restartPolicy": "OnFailure", "containers": []})})
    assert found == {at.format("postUpgrade") + ".containers": "needs at least one container"}


def test_a_zero_timeout_is_refused() -> None:
    hook = {"http": {"url": "http://h/x"}, "timeout": "0s"}
    assert _problems({"preUpgrade": hook}) == {
        "spec.strategy.hooks.preUpgrade.timeout": (
            "0s is too short: a bound under 1s ends a call before it can answer; set it to 1s or "
            "more"
        )
    }
