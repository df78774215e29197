"""Health analysis bookkeeping, pure: query templates, check validation, and verdicts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from orchestrator import api
from orchestrator.engine.conditions import format_micro_time, parse_time

__all__ = [
    "PROVIDERS",
    "Judgement",
    "args",
    "check_problems",
    "describe",
    "due_in",
    "judge",
    "record",
    "render",
]

PROVIDERS = ("prometheus", "plugin")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.\-/]+)\s*\}\}")


def render(query: str, cluster: str, stage: str, labels: Mapping[str, str]) -> str:
    """Fill {{ cluster }}, {{ stage }} and {{ labels.KEY }}; values are escaped for PromQL."""

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key == "cluster":
            text = cluster
        elif key == "stage":
            text = stage
        elif key.startswith("labels."):
            text = labels.get(key.removeprefix("labels."), "")
        else:
            raise ValueError(f"unknown placeholder {{{{ {key} }}}}")
        return text.replace("\\", "\\\\").replace('"', '\\"')

    return _PLACEHOLDER.sub(value, query)


def args(cluster: str, stage: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The template arguments handed to a plugin's QueryMetric."""
    out = {f"labels.{k}": v for k, v in labels.items()}
    out.update(cluster=cluster, stage=stage)
    return out


def check_problems(where: str, checks: api.HealthChecks) -> list[tuple[str, str]]:
    """(field, message) for everything wrong in a healthChecks block."""
    import promql_parser  # noqa: PLC0415  (a compiled PromQL parser, loaded only when checked)

    problems: list[tuple[str, str]] = []
    # Durations and their minimums are the model's (api.CheckInterval, api.Timeout); what is
    # checked here is that successThreshold passes fit in the timeout at all.
    interval = api.parse_duration(checks.interval)
    timeout = api.parse_duration(checks.timeout)
    # The first evaluation is at the start, the n-th (n - 1) intervals later.
    need = interval * (checks.success_threshold - 1)
    if timeout <= need:
        problems.append(
            (
                f"{where}.timeout",
                f"{checks.timeout} ends before successThreshold {checks.success_threshold} "
                f"evaluations {checks.interval} apart can pass (the analysis could only fail); "
                f"set it longer than {_span(need)}, shorten interval or lower successThreshold",
            )
        )
    names: set[str] = set()
    for i, check in enumerate(checks.checks):
        at = f"{where}.checks[{i}]"
        if check.name in names:
            problems.append((f"{at}.name", f"{check.name!r} is used twice; name checks uniquely"))
        names.add(check.name)
        if (check.metric is None) == (check.workloads is None):
            problems.append((at, "set exactly one of metric or workloads"))
            continue
        if check.metric is None:
            continue
        metric = check.metric
        bounds = metric.threshold_range
        if bounds.min is None and bounds.max is None:
            problems.append((f"{at}.metric.thresholdRange", "set min, max or both"))
        elif bounds.min is not None and bounds.max is not None and bounds.min > bounds.max:
            problems.append((f"{at}.metric.thresholdRange", "min is greater than max"))
        provider = metric.provider
        if provider.type not in PROVIDERS:
            problems.append(
                (
                    f"{at}.metric.provider.type",
                    f"{provider.type!r} is not a provider; use {' or '.join(PROVIDERS)}",
                )
            )
            continue
        try:
            sample = render(metric.query, "cluster", "stage", {})
        except ValueError as err:
            problems.append((f"{at}.metric.query", f"{err}; use cluster, stage or labels.KEY"))
            continue
        if provider.type == "prometheus":
            if provider.source_ref is None and (
                not provider.address or not re.match(r"^https?://[^/\s]+", provider.address)
            ):
                problems.append(
                    (
                        f"{at}.metric.provider.address",
                        "set the Prometheus base URL, e.g. http://prometheus:9090, "
                        "or sourceRef: a MetricSource",
                    )
                )
            try:
                promql_parser.parse(sample)
            except ValueError as err:
                problems.append((f"{at}.metric.query", f"is not valid PromQL: {err}"))
        elif provider.endpoint is not None and not re.fullmatch(
            api.ENDPOINT_PATTERN, provider.endpoint
        ):
            problems.append((f"{at}.metric.provider.endpoint", "write it as host:port"))
    return problems


@dataclass(frozen=True)
class Judgement:
    """What the analysis says now: passed, failed (with why), or wait this long."""

    passed: bool = False
    failed: bool = False
    message: str = ""
    wait_seconds: float = 0.0


def describe(results: Sequence[api.CheckResult] | None) -> str:
    """A short text of the failing checks (or all, when none fails)."""
    items = list(results or [])
    failing = [r for r in items if not r.passed] or items
    return (
        "; ".join(f"{r.name}: {r.message or ('value ' + _num(r.value))}" for r in failing)
        or "no result yet"
    )


def _span(length: timedelta) -> str:
    """A duration as the spec writes it (90s, 2m30s, 450ms)."""
    ms = round(length.total_seconds() * 1000)
    if ms % 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs or not text else "")


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def due_in(state: api.HealthState | None, checks: api.HealthChecks, now: datetime) -> float:
    """Seconds until the next evaluation is due (0 when due now)."""
    if state is None or state.last_check_time is None:
        return 0.0
    interval = api.parse_duration(checks.interval).total_seconds()
    elapsed = (now - parse_time(state.last_check_time)).total_seconds()
    return max(0.0, interval - elapsed)


def judge(state: api.HealthState | None, checks: api.HealthChecks, now: datetime) -> Judgement:
    """The verdict of an analysis so far."""
    if state is None:
        return Judgement(message="health checks starting")
    if state.passes >= checks.success_threshold:
        return Judgement(passed=True, message=f"health checks passed {state.passes} time(s)")
    if state.failures >= checks.failure_threshold:
        return Judgement(
            failed=True,
            message=(
                f"health checks failed {state.failures} time(s) (failureThreshold "
                f"{checks.failure_threshold}): {describe(state.results)}"
            ),
        )
    timeout = api.parse_duration(checks.timeout)
    if now - parse_time(state.since) > timeout:
        return Judgement(
            failed=True,
            message=(
                f"health checks did not pass {checks.success_threshold} time(s) in a row within "
                f"{checks.timeout}: {describe(state.results)}"
            ),
        )
    progress = f"{state.passes}/{checks.success_threshold} passes"
    if state.results and not all(r.passed for r in state.results):
        progress += f", {state.failures}/{checks.failure_threshold} failures: "
        progress += describe(state.results)
    return Judgement(message=f"health checks {progress}", wait_seconds=due_in(state, checks, now))


def record(
    state: api.HealthState | None, results: Sequence[api.CheckResult], now: datetime
) -> api.HealthState:
    """The state after one evaluation: all passed → passes + 1, else passes reset, failures + 1."""
    stamp = format_micro_time(now)  # sub-second, so short intervals are kept exactly
    base = state or api.HealthState(since=stamp)
    ok = all(r.passed for r in results)
    return base.model_copy(
        update={
            "passes": base.passes + 1 if ok else 0,
            "failures": base.failures + (0 if ok else 1),
            "last_check_time": stamp,
            "results": list(results),
        }
    )
