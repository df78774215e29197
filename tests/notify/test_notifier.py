"""orchestrator.adapters.notify.Notifier against a real HTTP(S) receiver on loopback."""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator import api
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.notify import Notifier
from orchestrator.adapters.secrets import SecretError
from orchestrator.engine.transitions import Transition
from tests.notify.receiver import Receiver
from tests.support.certs import generate_pki
from tests.support.kube import wait_for

E = api.NotificationEvent
NS, RUN = "team-a", "fleet-0123456789"
TOKEN = "s3cr3t-t0ken-value"
WHEN = datetime(2026, 11, 23, 4, 30, tzinfo=UTC)


class Secrets:
    """Secret keys by (namespace, name, key), read as orchestrator.adapters.secrets reads them."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str, str], bytes] = {}

    def put(self, name: str, key: str, value: str, namespace: str = NS) -> None:
        self.data[(namespace, name, key)] = value.encode()

    def secret_key(self, namespace: str, ref: api.SecretKeyRef, field: str) -> bytes:
        try:
            return self.data[(namespace, ref.name, ref.key)]
        except KeyError:
            raise SecretError(f"{field}: Secret {ref.name} has no key {ref.key}") from None


def transition(n: int, event: E = E.CLUSTER_FAILED) -> Transition:
    return Transition(
        id=f"uid-1/{event.value}/cluster-{n:02d}/0",
        reason="Failed",
        event=event,
        message=f"cluster-{n:02d}: nodePool/workers: FAILED",
        warning=True,
        stage="canary",
        cluster=f"cluster-{n:02d}",
        upgrade=f"{RUN}-cluster-{n:02d}",
    )


STATUS = api.UpdateRunStatus(
    phase=api.RunPhase.PROGRESSING,
    counts=api.RunCounts(total=4, upgraded=1, failed=1, pending=2),
)


def endpoint(kind: str = "CloudEvents", **extra: Any) -> api.Notification:
    return api.Notification.model_validate(
        {"name": "ops", "type": kind, "urlSecretRef": {"name": "hook", "key": "url"}, **extra}
    )


def count(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "multicluster_controller_notification_deliveries_total", {"result": result}
    )
    return value or 0.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def make() -> Iterator[Callable[..., tuple[Notifier, Metrics, Secrets]]]:
    made: list[Notifier] = []

    def build(**options: Any) -> tuple[Notifier, Metrics, Secrets]:
        metrics, secrets = Metrics(), Secrets()
        options.setdefault("backoff", 0.05)
        options.setdefault("backoff_max", 0.2)
        options.setdefault("timeout", 2.0)
        n = Notifier(secrets, metrics, **options)
        made.append(n)
        return n, metrics, secrets

    yield build
    for n in made:
        n.close()


def test_cloudevents_structured_mode_body_and_headers(
    receiver: Receiver, make: Callable[..., tuple[Notifier, Metrics, Secrets]]
) -> None:
    notifier, metrics, secrets = make()
    secrets.put("hook", "url", receiver.url)
    secrets.put("hook", "token", TOKEN)
    ep = endpoint(bearerTokenSecretRef={"name": "hook", "key": "token"})
    started = Transition("uid-1/RunStarted", "RunStarted", E.RUN_STARTED, "4 pinned", False)
    assert notifier.notify(NS, RUN, [ep], [started, transition(1)], STATUS, WHEN) == 2
    wait_for("both delivered", lambda: len(receiver.requests()) == 2, timeout=10)
    first, second = receiver.requests()
    assert first.headers["content-type"] == "application/cloudevents+json; charset=utf-8"
    assert first.headers["authorization"] == f"Bearer {TOKEN}"
    assert first.path == "/hooks/T0SECRET/B0SECRET/xoxSECRETPATH"
    assert first.json() == {
        "specversion": "1.0",
        "id": "uid-1/RunStarted",
        "source": f"/apis/multicluster-ops.io/v1/namespaces/{NS}/updateruns/{RUN}",
        "type": "io.multicluster-ops.updaterun.RunStarted",
        "time": "2026-11-23T04:30:00.000000Z",
        "datacontenttype": "application/json",
        "data": {
            "run": RUN,
            "namespace": NS,
            "phase": "Progressing",
            "stage": None,
            "cluster": None,
            "message": "4 pinned",
            "counts": {
                "total": 4,
                "pending": 2,
                "inFlight": 0,
                "upgraded": 1,
                "failed": 1,
                "blocked": 0,
                "skipped": 0,
            },
        },
    }
    body = second.json()
    assert body["type"] == "io.multicluster-ops.updaterun.ClusterFailed"
    assert body["subject"] == "cluster-01" and body["data"]["cluster"] == "cluster-01"
    assert body["data"]["stage"] == "canary" and body["id"] == "uid-1/ClusterFailed/cluster-01/0"
    assert count(metrics, "delivered") == 2 and count(metrics, "retried") == 0


def test_slack_incoming_webhook_body_and_event_filter(
    receiver: Receiver, make: Callable[..., tuple[Notifier, Metrics, Secrets]]
) -> None:
    notifier, _, secrets = make()
    secrets.put("hook", "url", receiver.url)
    ep = endpoint("Slack", events=["ClusterFailed"])
    started = Transition("uid-1/RunStarted", "RunStarted", E.RUN_STARTED, "started", False)
    assert notifier.notify(NS, RUN, [ep], [started, transition(3)], STATUS, WHEN) == 1
    wait_for("delivered", receiver.requests, timeout=10)
    (only,) = receiver.requests()
    assert only.headers["content-type"] == "application/json"
    assert "authorization" not in only.headers
    assert only.json() == {
        "text": f":warning: UpdateRun {NS}/{RUN}: ClusterFailed cluster-03: "
        "cluster-03: nodePool/workers: FAILED"
    }


def test_the_same_transition_is_queued_once(
    receiver: Receiver, make: Callable[..., tuple[Notifier, Metrics, Secrets]]
) -> None:
    notifier, metrics, secrets = make()
    secrets.put("hook", "url", receiver.url)
    for _ in range(3):  # a pass that repeats computes the same transition (same id)
        notifier.notify(NS, RUN, [endpoint()], [transition(1)], STATUS, WHEN)
    wait_for("delivered", lambda: count(metrics, "delivered") == 1, timeout=10)
    time.sleep(0.3)  # quiet period: a duplicate would arrive here
    assert len(receiver.requests()) == 1


def test_backoff_through_503_and_connection_refused_then_every_one_once_in_order(
    receiver: Receiver, make: Callable[..., tuple[Notifier, Metrics, Secrets]]
) -> None:
    notifier, metrics, secrets = make()
    secrets.put("hook", "url", receiver.url)
    receiver.mode = "503"
    notifier.notify(NS, RUN, [endpoint()], [transition(i) for i in range(3)], STATUS, WHEN)
    wait_for("a few 503s", lambda: receiver.refused_503 >= 3, timeout=10)
    receiver.stop()  # now nothing listens: connection refused
    seen = count(metrics, "retried")
    wait_for("retried while refused", lambda: count(metrics, "retried") >= seen + 3, timeout=10)
    assert receiver.requests() == [] and notifier.pending() == 3
    # Backoff: attempts are spaced, not a busy loop (0.05 s doubling up to 0.2 s).
    assert count(metrics, "retried") < 60
    receiver.mode = "ok"
    receiver.release.clear()
    receiver.start()
    wait_for("all delivered", lambda: len(receiver.requests()) == 3, timeout=10)
    ids = [b["id"] for b in receiver.bodies()]
    assert ids == [f"uid-1/ClusterFailed/cluster-{i:02d}/0" for i in range(3)]  # in order
    assert count(metrics, "delivered") == 3 and count(metrics, "dropped") == 0
    assert notifier.pending() == 0


def test_a_notification_older_than_max_age_is_dropped_and_counted(
    receiver: Receiver, make: Callable[..., tuple[Notifier, Metrics, Secrets]]
) -> None:
    notifier, metrics, secrets = make(max_age=0.5)
    secrets.put("hook", "url", receiver.url)
    receiver.stop()
    notifier.notify(NS, RUN, [endpoint()], [transition(1)], STATUS, WHEN)
    wait_for("dropped", lambda: count(metrics, "dropped") == 1, timeout=10)
    assert notifier.pending() == 0 and count(metrics, "retried") >= 1
    receiver.start()
    time.sleep(0.3)  # quiet period: a dropped notification is never sent
    assert receiver.requests() == []


def test_queue_full_drops_the_oldest_and_notify_never_blocks(
    receiver: Receiver,
    make: Callable[..., tuple[Notifier, Metrics, Secrets]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    notifier, metrics, secrets = make(capacity=3, workers=1)
    secrets.put("hook", "url", receiver.url)
    receiver.mode = "hold"  # the receiver takes the first and does not answer
    notifier.notify(NS, RUN, [endpoint()], [transition(0)], STATUS, WHEN)
    wait_for("the first is in flight", lambda: receiver.arrivals == 1, timeout=10)
    started = time.monotonic()
    notifier.notify(NS, RUN, [endpoint()], [transition(i) for i in range(1, 6)], STATUS, WHEN)
    assert time.monotonic() - started < 0.5  # queued, not sent: a reconcile never waits
    assert count(metrics, "dropped") == 3 and notifier.pending() == 3
    assert "notification queue full" in caplog.text
    receiver.mode = "ok"
    receiver.release.set()
    wait_for("the rest delivered", lambda: len(receiver.requests()) == 3, timeout=10)
    clusters = [b["data"]["cluster"] for b in receiver.bodies()]
    assert clusters == ["cluster-00", "cluster-04", "cluster-05"]  # oldest waiting dropped


def test_urls_and_tokens_never_reach_the_logs(
    receiver: Receiver,
    make: Callable[..., tuple[Notifier, Metrics, Secrets]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    notifier, metrics, secrets = make(max_age=1.0)
    secrets.put("hook", "url", receiver.url)
    secrets.put("hook", "token", TOKEN)
    secrets.put("bad", "url", "file:///etc/passwd?xoxSECRETPATH")
    receiver.mode = "503"
    token = {"bearerTokenSecretRef": {"name": "hook", "key": "token"}}
    endpoints = [
        endpoint(**token),
        api.Notification.model_validate(
            {"name": "local", "urlSecretRef": {"name": "bad", "key": "url"}}
        ),
        api.Notification.model_validate(
            {"name": "nokey", "urlSecretRef": {"name": "missing", "key": "url"}}
        ),
        api.Notification.model_validate(
            {
                "name": "badtoken",
                "urlSecretRef": {"name": "hook", "key": "url"},
                "bearerTokenSecretRef": {"name": "hook", "key": "broken-token"},
            }
        ),
        api.Notification.model_validate(
            {"name": "spaces", "urlSecretRef": {"name": "hook", "key": "spaced-url"}}
        ),
    ]
    secrets.put("hook", "broken-token", f"{TOKEN}\r\nX-Injected: {TOKEN}")
    secrets.put("hook", "spaced-url", receiver.url + "/with a space")
    notifier.notify(NS, RUN, endpoints, [transition(1)], STATUS, WHEN)
    wait_for("all five dropped", lambda: count(metrics, "dropped") == 5, timeout=15)
    assert receiver.requests() == []
    malformed = "the URL or the bearer token read from its Secrets is malformed"
    assert f"spec.notifications[3] (badtoken): {malformed}" in caplog.text
    assert f"spec.notifications[4] (spaces): {malformed}" in caplog.text
    # Errors name the field and the fix, never the value.
    assert "spec.notifications[1] (local).urlSecretRef: Secret bad key url must hold an http" in (
        caplog.text
    )
    assert "spec.notifications[2] (nokey).urlSecretRef: Secret missing has no key url" in (
        caplog.text
    )
    assert "HTTP 503" in caplog.text
    for secret in (TOKEN, "xoxSECRETPATH", "T0SECRET", "/etc/passwd", f":{receiver.port}"):
        assert secret not in caplog.text, secret


def test_https_with_the_ca_from_a_secret(
    tmp_path: Path, make: Callable[..., tuple[Notifier, Metrics, Secrets]]
) -> None:
    pki = generate_pki(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server.cert_file, pki.server.key_file)
    receiver = Receiver(tls=context).start()
    notifier, metrics, secrets = make()
    try:
        secrets.put("hook", "url", receiver.url)
        secrets.put("hook", "ca.crt", pki.ca_pem.decode())
        secrets.put("other", "url", receiver.url)
        trusted = endpoint(caSecretRef={"name": "hook", "key": "ca.crt"})
        untrusted = api.Notification.model_validate(
            {"name": "untrusted", "urlSecretRef": {"name": "other", "key": "url"}}
        )
        notifier.notify(NS, RUN, [trusted, untrusted], [transition(1)], STATUS, WHEN)
        wait_for("delivered over TLS", lambda: len(receiver.requests()) == 1, timeout=10)
        # Without the CA the receiver's certificate is not trusted: retried, never delivered.
        wait_for("the untrusted one retried", lambda: count(metrics, "retried") >= 2, timeout=10)
        assert len(receiver.requests()) == 1 and count(metrics, "delivered") == 1
    finally:
        # The sender stops first: a TLS connection the closing listener resets before the
        # handshake leaks its socket in CPython's ssl (SSLSocket._create re-raises ECONNRESET
        # without closing), a ResourceWarning that would fail the test at random.
        notifier.close()
        receiver.stop()
