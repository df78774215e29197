"""Notifications: a run's transitions POSTed to its endpoints off the reconcile path.

`Notifier.notify` is called by the UpdateRun controller after a pass wrote a change; it builds
the bodies (CloudEvents 1.0 structured JSON, or a Slack incoming-webhook message) and queues
them, and never blocks: the queue is bounded and, when full, the oldest waiting notification is
dropped (counted, logged without its URL). A few worker threads deliver: in order per endpoint,
each failure retried with exponential backoff (tenacity's wait strategy) until the notification
is `max_age` old, then dropped and counted. A notification failure never slows a rollout.

URLs, bearer tokens and CA bundles are read from Secrets in the run's namespace (through
orchestrator.adapters.secrets, so the orchestrator's RBAC decides where that is possible) by the
workers, when they deliver. A Slack webhook URL is a secret: no URL or token is ever logged,
put in a status or in an error message; failures are described by status code or error kind.
Only http and https URLs are called, redirects are not followed.

Nothing is persisted: notifications waiting in the queue when the process ends are lost, and
the next replica does not send them (it computes transitions only from its own writes).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from tenacity import RetryCallState, Retrying, wait_exponential, wait_random

from orchestrator import api
from orchestrator.adapters import outbound
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.secrets import SecretError
from orchestrator.engine.conditions import format_micro_time
from orchestrator.engine.transitions import Transition
from plugins.sdk.endpoint_errors import classify_exception, classify_http

__all__ = ["DEFAULT_MAX_AGE", "Notifier", "SecretSource", "cloudevent", "slack_message"]

log = logging.getLogger(__name__)

#: How long a notification is retried before it is dropped.
DEFAULT_MAX_AGE = 3600.0
#: Notifications waiting, over every endpoint, before the oldest is dropped.
DEFAULT_CAPACITY = 10_000
#: Ids remembered per endpoint so the same transition is never queued twice.
_REMEMBERED = 50_000
_RETRY_STATUS = frozenset({408, 425, 429})
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"


class SecretSource(Protocol):
    """Reads one key of one Secret (orchestrator.adapters.secrets.TLSResolver)."""

    def secret_key(self, namespace: str, ref: api.SecretKeyRef, field: str) -> bytes:
        """The key's bytes; SecretError (naming the field) when it cannot be read."""


class _Permanent(Exception):
    """Delivery cannot succeed by asking again (a 4xx answer, a URL that is not http(s))."""


def cloudevent(
    transition: Transition,
    namespace: str,
    run: str,
    status: api.UpdateRunStatus,
    when: datetime,
) -> dict[str, Any]:
    """The CloudEvents 1.0 structured-mode body of one transition."""
    event = transition.event.value if transition.event else transition.reason
    body: dict[str, Any] = {
        "specversion": "1.0",
        "id": transition.id,
        "source": f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/updateruns/{run}",
        "type": f"io.multicluster-ops.updaterun.{event}",
        "time": format_micro_time(when),
        "datacontenttype": "application/json",
        "data": {
            "run": run,
            "namespace": namespace,
            "phase": status.phase.value if status.phase else None,
            "stage": transition.stage,
            "cluster": transition.cluster,
            "message": transition.message,
            "counts": status.counts.dump() if status.counts else {},
        },
    }
    if transition.subject:
        body["subject"] = transition.subject
    return body


def slack_message(transition: Transition, namespace: str, run: str) -> dict[str, Any]:
    """A Slack incoming-webhook body: one line a person reads."""
    event = transition.event.value if transition.event else transition.reason
    about = f" {transition.subject}" if transition.subject else ""
    icon = ":warning: " if transition.warning else ""
    text = f"{icon}UpdateRun {namespace}/{run}: {event}{about}: {transition.message}"
    return {"text": text.replace("\n", " ")[:3000]}


@dataclass(eq=False)  # identity: an item is removed from its lane by itself
class _Item:
    """One notification waiting for delivery."""

    lane: _Lane
    transition_id: str
    event: str
    body: bytes
    content_type: str
    created: float
    attempt: int = 0


@dataclass(eq=False)
class _Lane:
    """One endpoint: its notifications in order, delivered one at a time."""

    key: tuple[str, ...]
    namespace: str
    notification: api.Notification
    where: str
    items: deque[_Item] = field(default_factory=deque)
    busy: bool = False
    due: float = 0.0
    #: Transition ids queued for this endpoint (bounded), so none is queued twice.
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)


@dataclass
class Notifier:
    """Delivers notifications on a few background threads; `notify` never blocks."""

    secrets: SecretSource
    metrics: Metrics
    workers: int = 4
    capacity: int = DEFAULT_CAPACITY
    max_age: float = DEFAULT_MAX_AGE
    #: First retry delay, and the longest (tenacity wait_exponential multiplier and max).
    backoff: float = 1.0
    backoff_max: float = 300.0
    timeout: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _lanes: dict[tuple[str, ...], _Lane] = field(default_factory=dict)
    _size: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: bool = False

    def __post_init__(self) -> None:
        self._wait = wait_exponential(multiplier=self.backoff, max=self.backoff_max) + wait_random(
            0, self.backoff / 2
        )

    # -- the reconcile side --------------------------------------------------------------------

    def notify(
        self,
        namespace: str,
        run: str,
        notifications: Sequence[api.Notification],
        transitions: Sequence[Transition],
        status: api.UpdateRunStatus,
        when: datetime,
    ) -> int:
        """Queue the transitions each endpoint asked for; returns how many were queued."""
        queued = 0
        for index, notification in enumerate(notifications):
            wanted = set(notification.events or api.NotificationEvent)
            chosen = [t for t in transitions if t.event is not None and t.event in wanted]
            if not chosen:
                continue
            where = f"spec.notifications[{index}] ({notification.name})"
            for t in chosen:
                if notification.type == api.NotificationType.SLACK:
                    body: dict[str, Any] = slack_message(t, namespace, run)
                    ctype = "application/json"
                else:
                    body = cloudevent(t, namespace, run, status, when)
                    ctype = CLOUDEVENTS_CONTENT_TYPE
                data = json.dumps(body, separators=(",", ":")).encode()
                queued += self._put(namespace, notification, where, t, data, ctype)
        return queued

    def _put(
        self,
        namespace: str,
        notification: api.Notification,
        where: str,
        t: Transition,
        data: bytes,
        ctype: str,
    ) -> int:
        key = _lane_key(namespace, notification)
        with self._cond:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(key, namespace, notification, where)
            lane.notification, lane.where = notification, where  # the latest spec wins
            if t.id in lane.seen:
                return 0
            lane.seen[t.id] = None
            if len(lane.seen) > _REMEMBERED:
                lane.seen.popitem(last=False)
            if self._size >= self.capacity:
                self._drop_oldest()
            event = t.event.value if t.event else t.reason
            lane.items.append(_Item(lane, t.id, event, data, ctype, self.clock()))
            self._size += 1
            self.metrics.notification_queue.set(self._size)
            self._start_locked()
            self._cond.notify()
        return 1

    def _drop_oldest(self) -> None:
        """Queue full: drop the oldest notification not being delivered right now."""
        waiting = [
            lane.items[1 if lane.busy else 0]
            for lane in self._lanes.values()
            if len(lane.items) > (1 if lane.busy else 0)
        ]
        if not waiting:
            return
        oldest = min(waiting, key=lambda i: i.created)
        oldest.lane.items.remove(oldest)
        self._size -= 1
        self.metrics.notification_deliveries.labels("dropped").inc()
        log.warning(
            "notification queue full (%d): dropped the oldest, %s for %s in namespace %s",
            self.capacity,
            oldest.event,
            oldest.lane.where,
            oldest.lane.namespace,
        )

    def _start_locked(self) -> None:
        if self._threads or self._stop:
            return
        for n in range(max(1, self.workers)):
            thread = threading.Thread(target=self._work, name=f"notify-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def pending(self) -> int:
        """Notifications waiting or being delivered."""
        with self._cond:
            return self._size

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers (what is still queued is lost, as after a crash)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)

    # -- the workers ------------------------------------------------------------------------------

    def _next(self) -> _Item | None:
        """The next due notification of a lane not being delivered (waits); None: stopping."""
        with self._cond:
            while not self._stop:
                now = self.clock()
                ready = [lane for lane in self._lanes.values() if lane.items and not lane.busy]
                due = [lane for lane in ready if lane.due <= now]
                if due:
                    lane = min(due, key=lambda x: x.items[0].created)
                    lane.busy = True
                    return lane.items[0]
                wait = min((lane.due - now for lane in ready), default=1.0)
                self._cond.wait(min(max(wait, 0.01), 1.0))
                self._forget_idle()
            return None

    def _forget_idle(self) -> None:
        """Lanes with nothing queued keep only their remembered ids (bounded per lane)."""
        if len(self._lanes) > 1000:
            for key in [k for k, lane in self._lanes.items() if not lane.items and not lane.busy]:
                del self._lanes[key]

    def _work(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            outcome = "retry"
            reason = ""
            try:
                self._deliver(item)
                outcome = "delivered"
            except _Permanent as err:
                outcome, reason = "dropped", str(err)
            except Exception as err:  # every failure is retried or dropped, none ends the worker
                reason = _describe(err)
            self._done(item, outcome, reason)

    def _done(self, item: _Item, outcome: str, reason: str) -> None:
        lane = item.lane
        with self._cond:
            lane.busy = False
            age = self.clock() - item.created
            if outcome == "retry" and age + self._delay(item.attempt + 1) > self.max_age:
                outcome = "dropped"
                reason = f"{reason}; retried for {int(age)}s, giving up"
            if outcome == "retry":
                item.attempt += 1
                delay = self._delay(item.attempt)
                lane.due = self.clock() + delay
                self.metrics.notification_deliveries.labels("retried").inc()
                log.info(
                    "notification %s for %s in namespace %s not delivered (%s); "
                    "attempt %d, next in %.1fs",
                    item.event,
                    lane.where,
                    lane.namespace,
                    reason,
                    item.attempt,
                    delay,
                )
            else:
                lane.due = 0.0
                if lane.items and lane.items[0] is item:
                    lane.items.popleft()
                    self._size -= 1
                self.metrics.notification_deliveries.labels(outcome).inc()
                if outcome == "dropped":
                    log.warning(
                        "notification %s for %s in namespace %s dropped: %s",
                        item.event,
                        lane.where,
                        lane.namespace,
                        reason,
                    )
            self.metrics.notification_queue.set(self._size)
            self._cond.notify_all()

    def _delay(self, attempt: int) -> float:
        state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
        state.attempt_number = attempt
        return float(self._wait(state))

    def _deliver(self, item: _Item) -> None:
        lane = item.lane
        n, ns = lane.notification, lane.namespace
        where = lane.where
        try:
            url = self.secrets.secret_key(ns, n.url_secret_ref, f"{where}.urlSecretRef")
            token = (
                self.secrets.secret_key(
                    ns, n.bearer_token_secret_ref, f"{where}.bearerTokenSecretRef"
                )
                if n.bearer_token_secret_ref is not None
                else None
            )
            ca = (
                self.secrets.secret_key(ns, n.ca_secret_ref, f"{where}.caSecretRef")
                if n.ca_secret_ref is not None
                else None
            )
        except SecretError as err:
            raise _SecretUnreadable(str(err)) from err
        target = url.decode("utf-8", "replace").strip()
        not_http = _Permanent(
            f"{where}.urlSecretRef: Secret {n.url_secret_ref.name} key "
            f"{n.url_secret_ref.key} must hold an http or https URL"
        )
        try:
            scheme = urllib.parse.urlsplit(target).scheme.lower()
        except ValueError:
            raise not_http from None
        if scheme not in ("http", "https"):
            raise not_http
        headers = {"Content-Type": item.content_type, "User-Agent": "fleet-orchestrator"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token.decode('utf-8', 'replace').strip()}"
        if n.type == api.NotificationType.CLOUD_EVENTS:
            headers["Idempotency-Key"] = item.transition_id
        via = outbound.opener(ca.decode() if ca is not None else None)
        try:
            # An error answer's body is never read: it may echo the URL or the token.
            answer = outbound.post(via, target, item.body, headers, self.timeout, drain=65536)
        except (ValueError, http.client.InvalidURL):
            # http.client's words would quote the URL or the header: never shown.
            raise _Permanent(
                f"{where}: the URL or the bearer token read from its Secrets is malformed"
            ) from None
        if not answer.ok:
            reason = classify_http(answer.status).reason
            if answer.status in _RETRY_STATUS or answer.status >= 500:
                raise _Retry(reason)
            raise _Permanent(f"the endpoint answered: {reason}")


class _Retry(Exception):
    """A failure asking again may cure (already described without the URL)."""


class _SecretUnreadable(Exception):
    """A referenced Secret or key could not be read (the message names the field)."""


def _lane_key(namespace: str, n: api.Notification) -> tuple[str, ...]:
    return (namespace, n.name, n.url_secret_ref.name, n.url_secret_ref.key)


def _describe(err: BaseException) -> str:
    """A failure in words that never include the URL or a token."""
    if isinstance(err, _Retry | _SecretUnreadable):
        return str(err)
    return classify_exception(err).reason
