"""The HTTP hook executor against a real receiver on loopback: the body and Idempotency-Key,
once per id, retries with backoff on 5xx / refused connections / timeouts, failures with the
status and a fixed reason (the body only in the log, redacted), the whole hook bounded by
Hook.timeout, no redirects, and (on the real apiserver) URL, bearer token and CA from Secrets
that never show in a message."""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from orchestrator import api
from orchestrator.adapters.hooks import HookExecutor
from orchestrator.adapters.kube import KubeClient
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.secrets import TLSResolver
from orchestrator.engine.decide import PRE_HOOK, HookObs, HookState, hook_id
from orchestrator.pipeline.driver import HookRequest
from tests.hooks.receiver import Receiver, serve
from tests.support.certs import generate_pki
from tests.support.kube import KubeCluster, wait_for

RUNS = "multicluster_controller_hook_runs"


def _request(hook: dict[str, Any], namespace: str = "team-a", attempt: int = 0) -> HookRequest:
    return HookRequest(
        run=f"{namespace}/rollout-1",
        run_uid="uid-7",
        upgrade="rollout-1-0a1b2c",
        cluster_id="prod-east",
        kind=PRE_HOOK,
        id=hook_id("uid-7", "prod-east", PRE_HOOK, attempt),
        attempt=attempt,
        hook=api.Hook.model_validate(hook),
        current_version="1.28.5",
        target_version="1.29.1",
        start_time=datetime.now(UTC),
    )


@pytest.fixture
def executor() -> Iterator[tuple[HookExecutor, list[str]]]:
    woken: list[str] = []
    ex = HookExecutor(None, TLSResolver(None), wake=woken.append, metrics=Metrics())  # type:
    # ignore[arg-type]
    try:
        yield ex, woken
    finally:
        ex.close()


def _outcome(ex: HookExecutor, request: HookRequest, timeout: float = 30.0) -> HookObs:
    return wait_for(
        "the hook's outcome",
        lambda: (o := ex.observe(request)).state != HookState.RUNNING and o,
        timeout=timeout,
    )


def test_a_2xx_passes_and_the_receiver_gets_the_body_once(
    executor: tuple[HookExecutor, list[str]],
) -> None:
    ex, woken = executor
    with serve(Receiver([(204, "", 0.0)])) as rcv:
        req = _request({"http": {"url": rcv.url}, "timeout": "1m"})
        ex.start(req)
        ex.start(req)  # the same id again: nothing more is sent
        assert _outcome(ex, req) == HookObs(HookState.SUCCEEDED, "HTTP 204")
        ex.start(req)
        time.sleep(0.2)  # anything wrongly sent again would have arrived by now
        assert len(rcv.received) == 1
        got = rcv.received[0]
    assert got.path == "/hook"
    assert got.headers["idempotency-key"] == req.id
    assert got.headers["content-type"] == "application/json"
    assert "authorization" not in got.headers
    assert got.body == {
        "hook": "preUpgrade",
        "run": "rollout-1",
        "namespace": "team-a",
        "cluster": "prod-east",
        "currentVersion": "1.28.5",
        "targetVersion": "1.29.1",
        "attempt": 0,
        "id": req.id,
    }
    assert woken == ["team-a/rollout-1"]
    assert ex.metrics is not None
    labels = {"hook": "preUpgrade", "type": "http", "result": "succeeded"}
    assert ex.metrics.registry.get_sample_value(f"{RUNS}_total", labels) == 1


def test_5xx_is_retried_with_the_same_key_until_it_passes(
    executor: tuple[HookExecutor, list[str]],
) -> None:
    ex, _ = executor
    with serve(Receiver([(503, "busy", 0.0), (500, "oops", 0.0), (200, "ok", 0.0)])) as rcv:
        req = _request({"http": {"url": rcv.url, "retries": 3}, "timeout": "1m"})
        ex.start(req)
        assert _outcome(ex, req).state == HookState.SUCCEEDED
        assert rcv.by_key() == {req.id: 3}


def test_4xx_fails_at_once_with_the_status_and_the_body_only_in_the_log(
    executor: tuple[HookExecutor, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    ex, _ = executor
    body = "denied:   change freeze\n" + "x" * 1000
    with serve(Receiver([(403, body, 0.0)])) as rcv:
        req = _request({"http": {"url": rcv.url, "retries": 5}, "timeout": "1m"})
        ex.start(req)
        seen = _outcome(ex, req)
        assert len(rcv.received) == 1  # a 4xx is an answer: no retry
    assert seen == HookObs(
        HookState.FAILED, "forbidden (HTTP 403); the endpoint's owner grants access"
    )
    logged = [r.getMessage() for r in caplog.records if req.id in r.getMessage()]
    assert any("denied: change freeze xxx" in line for line in logged), logged
    assert all(len(line) < 700 for line in logged), logged  # truncated


def test_a_receiver_echoing_the_request_says_nothing_in_the_status(
    executor: tuple[HookExecutor, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver that answers 400 with what it was sent (its path and query signature) and a
    secret of its own: the status carries the code and fixed words only; the log has the body
    with the signature masked."""
    ex, _ = executor
    marker = "hook-secret-7f3a9c"
    with serve(Receiver(), path="/h") as rcv:

        def answer() -> tuple[int, str, float]:
            got = rcv.received[-1]
            return (400, f"bad request to {got.path}; internal key {marker}", 0.0)

        rcv._answer = answer  # type: ignore[method-assign]
        url = rcv.url + "?sig=s1gnature-0001"
        req = _request({"http": {"url": url, "retries": 2}, "timeout": "1m"})
        ex.start(req)
        seen = _outcome(ex, req)
        assert len(rcv.received) == 1
    assert seen == HookObs(
        HookState.FAILED,
        "request rejected (HTTP 400); the endpoint's answer is logged, not shown",
    )
    text = caplog.text
    assert marker in text and "bad request to /h?***;" in text  # the answer, in the log
    assert "s1gnature-0001" not in text


def test_5xx_until_the_retries_run_out_fails_with_the_count(
    executor: tuple[HookExecutor, list[str]],
) -> None:
    ex, _ = executor
    with serve(Receiver([(502, "bad gateway", 0.0)])) as rcv:
        req = _request({"http": {"url": rcv.url, "retries": 2}, "timeout": "1m"})
        ex.start(req)
        seen = _outcome(ex, req)
        assert rcv.by_key() == {req.id: 3}
    assert seen == HookObs(HookState.FAILED, "server error (HTTP 502) after 3 tries")


def test_a_refused_connection_is_retried_and_never_names_the_address(
    executor: tuple[HookExecutor, list[str]],
) -> None:
    ex, _ = executor
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hook?token=s3cr3t"
    req = _request({"http": {"url": url, "retries": 1}, "timeout": "1m"})
    ex.start(req)
    seen = _outcome(ex, req)
    assert seen == HookObs(HookState.FAILED, "unreachable after 2 tries")


def test_a_slow_receiver_times_out_per_request(executor: tuple[HookExecutor, list[str]]) -> None:
    ex, _ = executor
    with serve(Receiver([(200, "late", 3.0)])) as rcv:
        req = _request({"http": {"url": rcv.url, "timeout": "1s", "retries": 0}, "timeout": "1m"})
        started = time.monotonic()
        ex.start(req)
        seen = _outcome(ex, req)
        assert time.monotonic() - started < 2.5
    assert seen == HookObs(HookState.FAILED, "no answer within 1s after 1 try")


def test_hook_timeout_bounds_all_the_retries(executor: tuple[HookExecutor, list[str]]) -> None:
    ex, _ = executor
    with serve(Receiver([(503, "", 0.0)])) as rcv:
        req = _request({"http": {"url": rcv.url, "retries": 10}, "timeout": "3s"})
        started = time.monotonic()
        ex.start(req)
        seen = _outcome(ex, req)
        took = time.monotonic() - started
        tries = len(rcv.received)
    assert seen.state == HookState.FAILED
    assert took < 4.5
    assert 2 <= tries < 11
    assert seen.message.startswith("unavailable (HTTP 503)")


def test_a_redirect_is_not_followed(executor: tuple[HookExecutor, list[str]]) -> None:
    ex, _ = executor
    with serve(Receiver([(302, "", 0.0)])) as rcv:
        req = _request({"http": {"url": rcv.url}, "timeout": "1m"})
        ex.start(req)
        assert _outcome(ex, req) == HookObs(
            HookState.FAILED, "redirected (HTTP 302); redirects are not followed"
        )
        assert len(rcv.received) == 1


def test_after_a_restart_a_started_id_is_unknown(executor: tuple[HookExecutor, list[str]]) -> None:
    ex, _ = executor
    with serve(Receiver([(200, "ok", 1.0)])) as rcv:
        req = _request({"http": {"url": rcv.url}, "timeout": "1m"})
        ex.start(req)
        assert ex.observe(req).state == HookState.RUNNING
        fresh = HookExecutor(None, TLSResolver(None))  # type: ignore[arg-type]
        try:
            assert fresh.observe(req) == HookObs(HookState.UNKNOWN)
        finally:
            fresh.close()
        assert _outcome(ex, req).state == HookState.SUCCEEDED


@pytest.mark.kube
def test_url_token_and_ca_from_secrets_never_shown(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    pki = generate_pki(tmp_path)
    kube = KubeClient(str(control_plane.kubeconfig))
    core = k8s.CoreV1Api(control_plane.api_client())
    ex = HookExecutor(kube, TLSResolver(kube))
    try:
        with serve(
            Receiver([(401, "bad token", 0.0), (200, "ok", 0.0)]),
            cert=(pki.server.cert_file, pki.server.key_file),
            path="/hooks/pre?sig=abc123",
        ) as rcv:
            data = {
                "url": rcv.url.replace("127.0.0.1", "localhost"),
                "token": "t0ken-value",
                "ca.crt": pki.ca_pem.decode(),
            }
            core.create_namespaced_secret(
                namespace,
                {
                    "metadata": {"name": "hook"},
                    "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
                },
            )
            hook = {
                "http": {
                    "urlSecretRef": {"name": "hook", "key": "url"},
                    "bearerTokenSecretRef": {"name": "hook", "key": "token"},
                    "caSecretRef": {"name": "hook", "key": "ca.crt"},
                    "retries": 0,
                },
                "timeout": "1m",
            }
            first = _request(hook, namespace)
            ex.start(first)
            failed = _outcome(ex, first)
            second = _request(hook, namespace, attempt=1)
            ex.start(second)
            passed = _outcome(ex, second)
            got = list(rcv.received)
        missing = _request(
            {"http": {"urlSecretRef": {"name": "nope", "key": "url"}}, "timeout": "1m"},
            namespace,
            attempt=2,
        )
        ex.start(missing)
        absent = _outcome(ex, missing)
    finally:
        ex.close()
        kube.close()
    assert failed == HookObs(
        HookState.FAILED,
        "unauthorized (HTTP 401); the endpoint does not accept the orchestrator's bearer "
        "token; its owner checks the token Secret",
    )
    assert passed == HookObs(HookState.SUCCEEDED, "HTTP 200")
    assert [r.headers["authorization"] for r in got] == ["Bearer t0ken-value"] * 2
    assert got[0].path == "/hooks/pre?sig=abc123"
    assert absent == HookObs(
        HookState.FAILED,
        "spec.strategy.hooks.preUpgrade.http.urlSecretRef: Secret nope does not exist",
    )
    for seen in (failed, passed, absent):
        assert "t0ken" not in seen.message and "abc123" not in seen.message
