"""The hook executor: pre/post-upgrade hooks as HTTP calls on a worker pool or Kubernetes Jobs.

The engine records a hook's intent (HookStatus Running, with the deterministic id of
`engine.hook_id`) and the driver persists it before `HookExecutor.start`; this module makes
sure one id never runs twice:

- HTTP (Flagger webhooks, Cluster API runtime hooks): a POST with a JSON body and the header
  `Idempotency-Key: <id>`, made on a worker thread (a reconcile never waits for it); retries
  with backoff on connection errors, timeouts and 5xx, each try bounded by `http.timeout` and
  all of them by `Hook.timeout`. 2xx passes; any other answer fails with its status code and
  a fixed reason (plugins.sdk.endpoint_errors); the body, redacted and truncated, goes to the
  controller's log only (a receiver may echo the token, or say what the tenant must not read).
  The outcome lives in this process only: after a restart the id is UNKNOWN and the engine
  fails the cluster instead of sending it again. The URL and the token never appear in a log
  line, a status or an error.
- Job (ClusterCurator's prehook/posthook): a batch/v1 Job named by the id in the run's
  namespace, owned by the ClusterUpgrade, from the hook's JobSpec template with CLUSTER_ID,
  CLUSTER_VERSION, TARGET_VERSION, HOOK, RUN and ATTEMPT in every container's environment and
  activeDeadlineSeconds from Hook.timeout. AlreadyExists adopts the Job (never a second one);
  its Complete / Failed conditions are the outcome, so Job hooks survive restarts.
"""

from __future__ import annotations

import copy
import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)
from tenacity.stop import stop_base

from orchestrator import api
from orchestrator.adapters import outbound
from orchestrator.adapters.kube import Conflict, KubeClient, KubeError, NotFound
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.secrets import SecretError, TLSResolver
from orchestrator.engine.decide import HookObs, HookState
from orchestrator.pipeline.driver import HookRequest
from plugins.sdk.endpoint_errors import classify_exception, classify_http, log_raw, url_secrets

__all__ = [
    "ENV_NAMES",
    "LABEL_CLUSTER_UPGRADE",
    "LABEL_HOOK",
    "LABEL_HOOK_ID",
    "HookExecutor",
    "http_body",
    "job_body",
]

log = logging.getLogger(__name__)

#: Labels of a hook's Job: the run is api.LABEL_RUN.
LABEL_CLUSTER_UPGRADE = f"{api.GROUP}/cluster-upgrade"
LABEL_HOOK = f"{api.GROUP}/hook"
LABEL_HOOK_ID = f"{api.GROUP}/hook-id"
#: The variables every container of a Job hook gets (they replace any of the same name).
ENV_NAMES = ("CLUSTER_ID", "CLUSTER_VERSION", "TARGET_VERSION", "HOOK", "RUN", "ATTEMPT")
#: Bytes of an HTTP answer read for the log (status shows only its classification).
BODY_READ = 4096
#: Outcomes of finished HTTP hooks are kept this long (the engine records them at once).
KEEP_FINISHED = timedelta(hours=6)


class _Retry(Exception):
    """A try that may succeed when repeated (connection error, timeout, 5xx)."""


def _label(value: str) -> str:
    """A label value (at most 63 characters) for a name that may be longer."""
    if len(value) <= 63:
        return value
    import hashlib  # noqa: PLC0415  (only long names need it)

    return f"{value[:46].rstrip('-.')}-{hashlib.sha256(value.encode()).hexdigest()[:16]}"


def _env(request: HookRequest) -> list[dict[str, str]]:
    values = (
        request.cluster_id,
        request.current_version,
        request.target_version,
        request.kind,
        request.run_name,
        str(request.attempt),
    )
    return [{"name": n, "value": v} for n, v in zip(ENV_NAMES, values, strict=True)]


def job_body(request: HookRequest, owner_uid: str) -> dict[str, Any]:
    """The Job of a Job hook: the template with our name, labels, owner, deadline and env."""
    assert request.hook.job is not None
    spec = copy.deepcopy(request.hook.job.template)
    # Kept until the ClusterUpgrade goes: a Job removed by its TTL before its outcome was read
    # would be created again under the same name, and the hook would run twice.
    spec.pop("ttlSecondsAfterFinished", None)
    deadline = max(1, int(api.parse_duration(request.hook.timeout).total_seconds()))
    own = spec.get("activeDeadlineSeconds")
    if not isinstance(own, int) or own <= 0 or own > deadline:
        spec["activeDeadlineSeconds"] = deadline
    pod = spec.setdefault("template", {}).setdefault("spec", {})
    env = _env(request)
    for key in ("initContainers", "containers"):
        for container in pod.get(key) or []:
            kept = [e for e in container.get("env") or [] if e.get("name") not in ENV_NAMES]
            container["env"] = kept + env
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": request.id,
            "namespace": request.namespace,
            "labels": {
                api.LABEL_RUN: _label(request.run_name),
                LABEL_CLUSTER_UPGRADE: _label(request.upgrade),
                LABEL_HOOK: request.kind,
                LABEL_HOOK_ID: request.id,
            },
            "ownerReferences": [
                {
                    "apiVersion": api.API_VERSION,
                    "kind": api.CLUSTER_UPGRADE_KIND,
                    "name": request.upgrade,
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": spec,
    }


def http_body(request: HookRequest) -> dict[str, Any]:
    """The JSON body of an HTTP hook."""
    return {
        "hook": request.kind,
        "run": request.run_name,
        "namespace": request.namespace,
        "cluster": request.cluster_id,
        "currentVersion": request.current_version,
        "targetVersion": request.target_version,
        "attempt": request.attempt,
        "id": request.id,
    }


@dataclass
class _HttpRun:
    """One HTTP hook in this process: running until `outcome` is set."""

    outcome: HookObs | None = None
    finished: datetime | None = None


class HookExecutor:
    """The product's `driver.HookRunner`: HTTP hooks on a worker pool, Job hooks on the API."""

    def __init__(
        self,
        kube: KubeClient,
        secrets: TLSResolver,
        wake: Callable[[str], None] = lambda run: None,
        workers: int = 16,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: Metrics | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.secrets = secrets
        #: Called with "namespace/name" of the run when one of its HTTP hooks finished.
        self.wake = wake
        self.clock = clock
        # Waiting on receivers, not CPU: a hook queued behind others spends its own timeout.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hook-http")
        self._lock = threading.Lock()
        self._http: dict[str, _HttpRun] = {}
        #: Job hooks whose create the apiserver refused for good (id → why).
        self._job_errors: dict[str, str] = {}
        #: Job hooks whose outcome was counted (a Job is observed on every pass).
        self._counted: set[str] = set()

    def close(self) -> None:
        """Stop the workers (calls in flight are abandoned; their ids stay UNKNOWN)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the HookRunner protocol -----------------------------------------------------------------

    def start(self, request: HookRequest) -> None:
        """Start a hook once per id (HTTP: queued on the pool; Job: created or adopted)."""
        if request.hook.http is not None:
            with self._lock:
                self._forget_old()
                if request.id in self._http:
                    return  # started already in this process: never twice
                self._http[request.id] = _HttpRun()
            self._pool.submit(self._run_http, request)
        else:
            self._start_job(request)

    def observe(self, request: HookRequest) -> HookObs:
        """What is known of the hook now."""
        if request.hook.http is not None:
            with self._lock:
                known = self._http.get(request.id)
            if known is None:
                return HookObs(HookState.UNKNOWN)
            return known.outcome or HookObs(HookState.RUNNING)
        return self._observe_job(request)

    # -- HTTP --------------------------------------------------------------------------------

    def _forget_old(self) -> None:
        cutoff = self.clock() - KEEP_FINISHED
        for key in [k for k, v in self._http.items() if v.finished and v.finished < cutoff]:
            del self._http[key]

    def _run_http(self, request: HookRequest) -> None:
        try:
            outcome = self._call_http(request)
        except Exception as err:  # a worker never dies silently; the hook fails instead
            # The type only: an exception's text or traceback may carry the URL.
            log.error("hook %s: unexpected %s", request.id, type(err).__name__)
            outcome = HookObs(HookState.FAILED, f"unexpected error ({type(err).__name__})")
        with self._lock:
            self._http[request.id] = _HttpRun(outcome, self.clock())
        self._count(request, "http", outcome)
        log.info("hook %s of %s: %s", request.id, request.run, outcome.state.value)
        self.wake(request.run)

    def _call_http(self, request: HookRequest) -> HookObs:
        http = request.hook.http
        assert http is not None
        where = f"spec.strategy.hooks.{request.kind}.http"
        ns = request.namespace
        try:
            if http.url_secret_ref is not None:
                url = self._secret(ns, http.url_secret_ref, f"{where}.urlSecretRef")
            else:
                url = http.url or ""
            token = ca = ""
            if http.bearer_token_secret_ref is not None:
                ref = http.bearer_token_secret_ref
                token = self._secret(ns, ref, f"{where}.bearerTokenSecretRef")
            if http.ca_secret_ref is not None:
                ca = self._secret(ns, http.ca_secret_ref, f"{where}.caSecretRef")
        except SecretError as err:
            return HookObs(HookState.FAILED, str(err))
        if not url.startswith(("http://", "https://")):
            return HookObs(HookState.FAILED, f"{where}: the URL must start with http(s)://")
        try:
            via = outbound.opener(ca or None)
        except ssl.SSLError:
            return HookObs(HookState.FAILED, f"{where}.caSecretRef: not a PEM CA bundle")
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": request.id,
            "User-Agent": "fleet-orchestrator-hook",
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(http_body(request)).encode()
        per_try = api.parse_duration(http.timeout).total_seconds()
        deadline = request.start_time + api.parse_duration(request.hook.timeout)
        secrets = (*url_secrets(url), token)
        tries = 0
        last = ""

        def one_try() -> HookObs:
            nonlocal tries, last
            tries += 1
            left = (deadline - self.clock()).total_seconds()
            if left <= 0:
                raise _Deadline
            try:
                answer = outbound.post(
                    via, url, data, headers, min(per_try, left), error_bytes=BODY_READ
                )
            except (urllib.error.URLError, OSError) as err:
                reason = err.reason if isinstance(err, urllib.error.URLError) else err
                if isinstance(reason, TimeoutError):
                    last = f"no answer within {http.timeout}"
                else:
                    last = classify_exception(err).reason
                raise _Retry from None
            if answer.ok:
                return HookObs(HookState.SUCCEEDED, f"HTTP {answer.status}")
            failure = classify_http(answer.status)
            # The answer may echo the token or hold the receiver's secrets: the log only.
            log_raw(f"hook {request.id} of {request.run}", failure, answer.body, secrets, log)
            last = failure.reason
            if answer.status >= 500:
                raise _Retry
            return HookObs(HookState.FAILED, failure.describe("", ""))

        clock = self.clock

        class _StopAtDeadline(stop_base):
            def __call__(self, retry_state: RetryCallState) -> bool:
                return clock() >= deadline

        retrying = Retrying(
            stop=stop_after_attempt(http.retries + 1) | _StopAtDeadline(),
            wait=wait_exponential(multiplier=0.5, max=10.0),
            retry=retry_if_exception_type(_Retry),
            sleep=self._sleep_until(deadline),
            reraise=True,
        )
        try:
            outcome: HookObs = retrying(one_try)
        except _Retry:
            outcome = HookObs(
                HookState.FAILED, f"{last} after {tries} tr{'y' if tries == 1 else 'ies'}"
            )
        except _Deadline:
            outcome = HookObs(
                HookState.FAILED, f"{last or 'not sent'}; out of time ({request.hook.timeout})"
            )
        except ValueError:  # an address urllib cannot parse (the text may hold the URL)
            outcome = HookObs(HookState.FAILED, f"{where}: the URL is not valid")
        return outcome

    def _count(self, request: HookRequest, type_: str, outcome: HookObs) -> None:
        if self.metrics is None or outcome.state not in (HookState.SUCCEEDED, HookState.FAILED):
            return
        if type_ == "job":
            with self._lock:
                if request.id in self._counted:
                    return
                if len(self._counted) > 100_000:  # bounded: an old id counted twice at worst
                    self._counted.clear()
                self._counted.add(request.id)
        result = outcome.state.value.lower()
        self.metrics.hook_runs.labels(request.kind, type_, result).inc()

    def _sleep_until(self, deadline: datetime) -> Callable[[float], None]:
        def sleep(seconds: float) -> None:
            left = (deadline - self.clock()).total_seconds()
            threading.Event().wait(max(0.0, min(seconds, left)))

        return sleep

    def _secret(self, namespace: str, ref: api.SecretKeyRef, field: str) -> str:
        try:
            return self.secrets.secret_key(namespace, ref, field).decode().strip()
        except KubeError as err:
            raise SecretError(
                f"{field}: Secret {ref.name} could not be read ({err.status})"
            ) from err
        except UnicodeDecodeError as err:
            raise SecretError(f"{field}: Secret {ref.name} key {ref.key} is not text") from err

    # -- Jobs --------------------------------------------------------------------------------

    def _start_job(self, request: HookRequest) -> None:
        ns = request.namespace
        try:
            owner = self.kube.get_object(api.CLUSTER_UPGRADE_PLURAL, ns, request.upgrade)
            self.kube.create_job(ns, job_body(request, owner["metadata"]["uid"]))
            log.info("hook %s of %s: Job created", request.id, request.run)
        except Conflict:
            log.info("hook %s of %s: Job exists; adopted", request.id, request.run)
        except KubeError as err:
            if err.status == 403:
                why = (
                    f"the orchestrator may not create Jobs in namespace {ns}; bind the "
                    f"ClusterRole fleet-orchestrator-hook-jobs there "
                    "(manifests/overlays/hook-jobs)"
                )
            else:
                why = f"Job {request.id} not created: {err}"
            if 400 <= err.status < 500 and err.status != 429:
                with self._lock:
                    self._job_errors[request.id] = why
            log.warning("hook %s of %s: %s", request.id, request.run, why)
            return
        with self._lock:  # created or adopted: an earlier refusal no longer stands
            self._job_errors.pop(request.id, None)

    def _observe_job(self, request: HookRequest) -> HookObs:
        seen = self._read_job(request)
        self._count(request, "job", seen)
        return seen

    def _read_job(self, request: HookRequest) -> HookObs:
        try:
            job = self.kube.get_job(request.namespace, request.id)
        except KubeError as err:
            with self._lock:
                why = self._job_errors.get(request.id)
            if why:  # its create was refused for good (and it is not there, or not readable)
                return HookObs(HookState.FAILED, why)
            if isinstance(err, NotFound):
                return HookObs(HookState.UNKNOWN)
            return HookObs(HookState.RUNNING, f"Job {request.id} not read: {err.status}")
        labels = job.get("metadata", {}).get("labels") or {}
        if labels.get(LABEL_HOOK_ID) != request.id:
            return HookObs(
                HookState.FAILED,
                f"a Job named {request.id} exists that this hook did not create; delete it "
                "and retry the cluster",
            )
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("status") != "True":
                continue
            words = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
            if cond.get("type") == "Complete":
                return HookObs(HookState.SUCCEEDED, f"Job {request.id} complete")
            if cond.get("type") == "Failed":
                return HookObs(HookState.FAILED, f"Job {request.id} failed: {words or 'Failed'}")
        return HookObs(HookState.RUNNING)


class _Deadline(Exception):
    """Hook.timeout passed before another try could be made."""
