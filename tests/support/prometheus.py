"""A real Prometheus (Debian's package) scraping a real sample app, both on loopback, for tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.kube import wait_for
from tests.support.orchestrator import free_port


class SampleApp:
    """Exposes workload_health and request_success_ratio per cluster; tests set the values."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.health = Gauge(
            "workload_health",
            "1 when the workload is healthy",
            ["cluster", "app", "namespace", "pod", "workload_kind"],
            registry=self.registry,
        )
        self.success = Gauge(
            "request_success_ratio",
            "share of requests that succeed",
            ["cluster"],
            registry=self.registry,
        )
        self.port = free_port()
        self._server: Any = None

    def set(self, cluster: str, success: float, health: float = 1.0) -> None:
        self.success.labels(cluster).set(success)
        self.health.labels(cluster, "web", "default", f"web-{cluster}", "Deployment").set(health)

    def start(self) -> None:
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@contextmanager
def running_prometheus(
    tmp: Path,
    targets: list[str] | None = None,
    interval: str = "1s",
    scrape_configs: list[dict[str, Any]] | None = None,
    name: str = "prometheus",
) -> Iterator[str]:
    """Start Prometheus scraping targets (or the given scrape_configs); yield its base URL once
    it has scraped a target."""
    binary = prometheus_binary()
    assert binary, "prometheus is not installed (apt-get install prometheus)"
    port = free_port()
    jobs = scrape_configs or [{"job_name": "sample", "static_configs": [{"targets": targets}]}]
    config = tmp / f"{name}.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": interval, "evaluation_interval": interval},
                "scrape_configs": jobs,
            }
        )
    )  # JSON is YAML
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / (name + '-tsdb')}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{name} scrapes its targets", lambda: _has_data(url), timeout=60, interval=0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _has_data(url: str) -> bool:
    query = urllib.parse.urlencode({"query": "up == 1"})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as r:
            return bool(json.loads(r.read())["data"]["result"])
    except OSError:
        return False


def _api(url: str, path: str, params: list[tuple[str, str]]) -> Any:
    """One Prometheus HTTP API call; its `data`, or AssertionError with Prometheus's error."""
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as error:  # 400/422: the expression is wrong
        body = json.loads(error.read() or b"{}")
    assert body.get("status") == "success", f"{path} {params}: {body}"
    return body["data"]


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query: [{"metric": labels, "value": [t, "v"]}, ...] (a scalar as one item)."""
    params = [("query", expr)] + ([("time", f"{at:.3f}")] if at is not None else [])
    data = _api(url, "query", params)
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return list(data["result"])


def query_range(
    url: str, expr: str, start: float, end: float, step: float = 1.0
) -> list[dict[str, Any]]:
    """A range query: [{"metric": labels, "values": [[t, "v"], ...]}, ...]."""
    params = [
        ("query", expr),
        ("start", f"{start:.3f}"),
        ("end", f"{end:.3f}"),
        ("step", str(step)),
    ]
    return list(_api(url, "query_range", params)["result"])


def label_values(url: str, label: str, match: str | None = None) -> set[str]:
    """Grafana's label_values(match, label): the label's values on the series `match` selects."""
    params = [("match[]", match)] if match else []
    return set(_api(url, f"label/{label}/values", params))
