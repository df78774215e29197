"""Prometheus instant queries over HTTP (standard library): workload_health series as samples."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

__all__ = ["PrometheusError", "Sample", "escape_label_value", "query_vector"]


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
    base_url: str, query: str, *, timeout: float = 10.0, token: str | None = None
) -> list[Sample]:
    """Runs an instant query that must answer a vector; NaN samples are dropped."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            detail = json.loads(err.read()).get("error", err.reason)
        except ValueError:
            detail = err.reason
        raise PrometheusError(f"Prometheus at {base_url} answered {err.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise PrometheusError(f"Prometheus at {base_url} is unreachable: {reason}") from None
    except ValueError:
        raise PrometheusError(f"Prometheus at {base_url} answered something not JSON") from None
    if body.get("status") != "success":
        raise PrometheusError(f"Prometheus at {base_url} failed the query: {body.get('error')}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(
            f"Prometheus at {base_url} answered a {data.get('resultType')}, not a vector"
        )
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
