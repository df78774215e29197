"""Prometheus instant queries over HTTP (standard library): workload_health series as samples."""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from plugins.sdk import LOG_HINT, Failure, classify_exception, log_raw, url_secrets

__all__ = ["PrometheusError", "Sample", "escape_label_value", "query_vector"]


log = logging.getLogger(__name__)
#: Bytes of a failed answer kept for the log (before redaction cuts it further).
_ANSWER_LIMIT = 65536


class PrometheusError(Exception):
    """The query could not be answered; the message says why (never a secret)."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels, value and the evaluation time."""

    labels: dict[str, str]
    value: float
    timestamp: float


def escape_label_value(text: str) -> str:
    """text escaped for use inside a double-quoted PromQL label matcher."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def query_vector(
    base_url: str,
    query: str,
    *,
    timeout: float = 10.0,
    token: str | None = None,
    name: str = "Prometheus",
) -> list[Sample]:
    """Runs an instant query that must answer a vector; NaN samples are dropped.

    A failure is PrometheusError in the SDK's fixed words for endpoint failures, naming the
    endpoint by `name`, never its URL (the plugin's config) nor what it answered: these
    messages reach CheckWorkloads answers and conditions. The answer goes to the log, redacted.
    """
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    sent: list[str] = [*url_secrets(base_url), *([token] if token else [])]

    def failed(failure: Failure, raw: str | bytes) -> PrometheusError:
        log_raw(f"query to {name}", failure, raw, sent, log)
        return PrometheusError(failure.describe("", name))

    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as err:
        with err:
            answer = err.read(_ANSWER_LIMIT)
        raise failed(classify_exception(err, "query"), answer) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise failed(classify_exception(err, "query"), f"{type(err).__name__}: {err}") from None
    try:
        body = json.loads(payload)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except ValueError as err:
        raise failed(classify_exception(err, "query"), payload[:_ANSWER_LIMIT]) from None
    if body.get("status") != "success":
        raise failed(Failure("", "query failed", LOG_HINT), payload[:_ANSWER_LIMIT])
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"{name} answered a {data.get('resultType')}, not a vector")
    samples = []
    for item in data.get("result") or []:
        try:
            stamp, raw = item["value"]
            value = float(raw)
        except (KeyError, TypeError, ValueError):
            continue
        if math.isnan(value):
            continue
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        samples.append(Sample(labels, value, float(stamp)))
    return samples
