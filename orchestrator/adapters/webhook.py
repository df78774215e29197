"""The admission webhooks: ClusterVersion and UpdateRun specs checked as the controllers check
them, before the apiserver stores them, and the requests people make stamped with the user the
apiserver authenticated; served over HTTPS with a cert-manager or self-managed certificate.

- `stamp` (pure) is the mutating side (POST /mutate): the JSON patch that sets who asked
  (engine/requester.py).

- `admit` decides one admission.k8s.io/v1 AdmissionRequest (pure): the controllers' own
  validation (`parse_model` + `validate_spec`, `as_cluster_version_spec` for runs), the pinned
  fields of a started UpdateRun, and the access check when one is given. Nothing that needs the
  fleet inventory (do the cluster ids exist?) is checked here: the controllers still do that.
- `WebhookServer` answers POST /validate over HTTPS; `ServingCert` reloads tls.crt/tls.key
  when they change (cert-manager renewals).
- Self-managed certificates (one CA + serving certificate shared by the replicas through a
  Secret) are orchestrator/adapters/webhook_certs.py.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socket import socket
from typing import Any

from orchestrator import api
from orchestrator.engine.initialize import as_cluster_version_spec
from orchestrator.engine.requester import PEOPLE_ANNOTATIONS, STAMPS, attested
from orchestrator.engine.validate import Problem, parse_model, validate_spec

__all__ = [
    "MUTATE_PATH",
    "PATH",
    "AccessCheck",
    "ServingCert",
    "WebhookServer",
    "admit",
    "denial_message",
    "mutation_review",
    "pinned_changes",
    "review",
    "stamp",
    "started",
]

log = logging.getLogger(__name__)

#: The HTTPS path the ValidatingWebhookConfiguration calls.
PATH = "/validate"
#: The HTTPS path the MutatingWebhookConfiguration calls (who asked).
MUTATE_PATH = "/mutate"
#: Largest AdmissionReview read (an object and its old version, each at most ~1.5 MB in etcd).
MAX_BODY = 8 * 1024 * 1024
#: Problems listed in a denial before "and N more".
SHOWN = 10

#: The access check (orchestrator/engine/access.py; docs/operations.md "Who may do what"): given
#: the object's namespace and its parsed spec, every Problem (field and fix); empty when allowed.
AccessCheck = Callable[[str, api.ClusterVersionSpec | api.UpdateRunSpec], Sequence[Problem]]


# -- deciding ----------------------------------------------------------------------------------


def admit(request: Mapping[str, Any], access: AccessCheck | None = None) -> list[Problem]:
    """Every reason to refuse one AdmissionRequest; empty: allowed.

    Only CREATE and UPDATE of ClusterVersions and UpdateRuns are judged. An UPDATE that leaves
    spec as it was (labels, annotations, finalizers, a deletion in progress) is always allowed,
    so an object stored while the webhook was down never becomes impossible to clean up.
    """
    operation = request.get("operation")
    kind = (request.get("kind") or {}).get("kind")
    obj = request.get("object") or {}
    old = request.get("oldObject") or {}
    if operation not in ("CREATE", "UPDATE") or kind not in (api.KIND, api.UPDATE_RUN_KIND):
        return []
    if operation == "UPDATE" and (
        (obj.get("metadata") or {}).get("deletionTimestamp") or obj.get("spec") == old.get("spec")
    ):
        return []
    namespace = str(request.get("namespace") or (obj.get("metadata") or {}).get("namespace", ""))
    spec: api.ClusterVersionSpec | api.UpdateRunSpec | list[Problem]
    if kind == api.KIND:
        spec = parse_model(api.ClusterVersionSpec, obj.get("spec"))
    else:
        spec = parse_model(api.UpdateRunSpec, obj.get("spec"))
    if isinstance(spec, list):
        return spec
    # As the controllers say it: who may do what first, then what is wrong with the spec.
    problems = list(access(namespace, spec)) if access is not None else []
    if isinstance(spec, api.ClusterVersionSpec):
        problems += validate_spec(spec)
    else:
        # A run a ClusterVersion created carries no cluster list: the controller pins it from
        # the ClusterVersion's spec, which was validated when that was admitted.
        if spec.cluster_version_ref is None:
            problems += validate_spec(as_cluster_version_spec(spec))
        if operation == "UPDATE":
            problems += pinned_changes(old, spec)
    return problems


def _escape(key: str) -> str:
    """An annotation key as a JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def stamp(
    request: Mapping[str, Any], trusted: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that records who asked, for one AdmissionRequest.

    A CREATE or UPDATE of a ClusterVersion or UpdateRun that changes its spec or a people
    annotation (approve, retry, skip, reason, requested-by) is stamped with the authenticated
    userInfo.username and groups and the digest of what they vouch for; any other request keeps
    the stamp it had (a writer that typed one gets the old one back). A `trusted` user (the
    orchestrator's own service account, handing a ClusterVersion's requests to its run) keeps
    the user it copied, with the digest of what it wrote.
    """
    kind = (request.get("kind") or {}).get("kind")
    if request.get("operation") not in ("CREATE", "UPDATE") or kind not in (
        api.KIND,
        api.UPDATE_RUN_KIND,
    ):
        return []
    obj = request.get("object") or {}
    old = request.get("oldObject") or {}
    now = dict((obj.get("metadata") or {}).get("annotations") or {})
    before = dict((old.get("metadata") or {}).get("annotations") or {})
    user = request.get("userInfo") or {}
    username = str(user.get("username") or "")
    asked = request.get("operation") == "CREATE" or obj.get("spec") != old.get("spec")
    asked = asked or any(now.get(k) != before.get(k) for k in PEOPLE_ANNOTATIONS)
    want = {k: before[k] for k in STAMPS if k in before}
    if username in trusted:
        # The hand-off copies the user and groups (engine.requester.handed), never the digest.
        user_key = api.ANNOTATION_REQUESTED_BY_USER
        want = {k: now[k] for k in STAMPS[:2] if k in now}
        kept = request.get("operation") == "UPDATE" and now.get(user_key) == before.get(user_key)
        if kept and before.get(api.ANNOTATION_REQUESTED_BY_STAMP) != attested(
            before, old.get("spec")
        ):
            want = {}  # the user did not speak for the object before: it does not now
        if want.get(user_key):
            want[api.ANNOTATION_REQUESTED_BY_STAMP] = attested(now, obj.get("spec"))
    elif asked and username:
        groups = [g for g in user.get("groups") or [] if g != "system:authenticated"]
        want = {
            api.ANNOTATION_REQUESTED_BY_USER: username,
            api.ANNOTATION_REQUESTED_BY_GROUPS: ",".join(groups),
            api.ANNOTATION_REQUESTED_BY_STAMP: attested(now, obj.get("spec")),
        }
    if all(now.get(k) == want.get(k) for k in STAMPS):
        return []
    if not (obj.get("metadata") or {}).get("annotations"):
        return [{"op": "add", "path": "/metadata/annotations", "value": {**now, **want}}]
    ops: list[dict[str, Any]] = []
    for key in STAMPS:
        path = f"/metadata/annotations/{_escape(key)}"
        if key in want and now.get(key) != want[key]:
            ops.append({"op": "add", "path": path, "value": want[key]})
        elif key not in want and key in now:
            ops.append({"op": "remove", "path": path})
    return ops


def mutation_review(
    body: Mapping[str, Any], trusted: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The AdmissionReview answering one of the mutating webhook: always allowed, with the
    stamp's patch; ValueError when it is not an AdmissionReview."""
    import base64  # noqa: PLC0415

    request = _request(body)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    patch = stamp(request, trusted)
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _request(body: Mapping[str, Any]) -> Mapping[str, Any]:
    if body.get("apiVersion") != "admission.k8s.io/v1" or body.get("kind") != "AdmissionReview":
        raise ValueError("expected an admission.k8s.io/v1 AdmissionReview")
    request = body.get("request")
    if not isinstance(request, Mapping) or not request.get("uid"):
        raise ValueError("the AdmissionReview has no request.uid")
    return request


def started(run: Mapping[str, Any]) -> bool:
    """True once the run pinned its ClusterUpgrades (condition Initialized=True)."""
    conditions = (run.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Initialized" and c.get("status") == "True" for c in conditions)


def _frozen(spec: api.UpdateRunSpec) -> api.UpdateRunSpec:
    """The spec with its live fields (state, floor, paused) set to fixed values."""
    strategy = (spec.strategy or api.Strategy()).model_copy(update={"paused": False})
    return spec.model_copy(
        update={"state": api.RunState.RUN, "required_available_count": 0, "strategy": strategy}
    )


def pinned_changes(old: Mapping[str, Any], new: api.UpdateRunSpec) -> list[Problem]:
    """One Problem per pinned field of a started run that the update changes."""
    if not started(old):
        return []
    before = parse_model(api.UpdateRunSpec, old.get("spec"))
    if isinstance(before, list):  # the controller cannot have pinned what does not parse
        return []
    a, b = _frozen(before), _frozen(new)
    fix = (
        "is pinned since the run started; only spec.state, spec.requiredAvailableCount and "
        "spec.strategy.paused may change (to roll out something else: set spec.state: Stop and "
        "create a new UpdateRun, or edit the ClusterVersion that owns this run)"
    )
    problems = []
    for name, info in api.UpdateRunSpec.model_fields.items():
        va, vb = getattr(a, name), getattr(b, name)
        if va == vb:
            continue
        alias = info.alias or name
        if name == "strategy":
            for sub, sinfo in api.Strategy.model_fields.items():
                if getattr(va, sub) != getattr(vb, sub):
                    problems.append(Problem(f"spec.strategy.{sinfo.alias or sub}", fix))
        else:
            problems.append(Problem(f"spec.{alias}", fix))
    return problems


def denial_message(problems: Sequence[Problem]) -> str:
    """The problems as the controllers' Invalid condition says them, joined with '; '."""
    text = "; ".join(str(p) for p in problems[:SHOWN])
    if len(problems) > SHOWN:
        text += f"; and {len(problems) - SHOWN} more"
    return text


def review(body: Mapping[str, Any], access: AccessCheck | None = None) -> dict[str, Any]:
    """The AdmissionReview answering one AdmissionReview; ValueError when it is not one."""
    request = _request(body)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    try:
        problems = admit(request, access)
    except Exception as err:  # an access check that could not read: the controller re-checks
        log.warning("admission of %s not fully checked: %s", _name(request), err)
        response["warnings"] = [
            f"not fully checked at admission ({type(err).__name__}); the controller checks "
            "again and reports problems in status (condition Ready, reason InvalidSpec)"
        ]
        problems = []
    if problems:
        kind = (request.get("kind") or {}).get("kind", "")
        message = denial_message(problems)
        log.info("denied %s %s: %s", request.get("operation"), _name(request), message)
        response["allowed"] = False
        response["status"] = {
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": message,
            "details": {
                "name": request.get("name") or "",
                "group": api.GROUP,
                "kind": kind,
                "causes": [
                    {"reason": "FieldValueInvalid", "field": p.field, "message": p.message}
                    for p in problems
                ],
            },
        }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _name(request: Mapping[str, Any]) -> str:
    kind = (request.get("kind") or {}).get("kind", "?")
    return f"{kind} {request.get('namespace') or ''}/{request.get('name') or ''}"


# -- serving -----------------------------------------------------------------------------------


class ServingCert:
    """A TLS server context from tls.crt/tls.key, rebuilt when either file changes."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._context: ssl.SSLContext | None = None
        self.context()  # fail at start, not at the first request, when the files are unusable

    def context(self) -> ssl.SSLContext:
        """The context for the next connection."""
        stamp = (self.cert_file.stat().st_mtime_ns, self.key_file.stat().st_mtime_ns)
        with self._lock:
            if self._context is None or stamp != self._stamp:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.set_alpn_protocols(["http/1.1"])
                try:
                    context.load_cert_chain(self.cert_file, self.key_file)
                except (ssl.SSLError, OSError) as err:
                    if self._context is None:
                        raise
                    # A renewal caught half-written: keep serving the previous pair.
                    log.warning("webhook certificate not reloaded: %s", err)
                    return self._context
                if self._context is not None:
                    log.info("webhook certificate reloaded from %s", self.cert_file)
                self._context, self._stamp = context, stamp
            return self._context


class WebhookServer:
    """POST /validate and /mutate over HTTPS in background threads (one per connection)."""

    def __init__(
        self,
        host: str,
        port: int,
        cert: ServingCert,
        access: AccessCheck | None = None,
        trusted: frozenset[str] = frozenset(),
    ) -> None:
        self.cert = cert
        handler = _handler(access, trusted)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket, Any]:
                sock, addr = self.socket.accept()
                # The handshake runs in the connection's thread (first read), never here.
                return cert.context().wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                ), addr

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that fails the handshake (e.g. a stale caBundle) or drops the
                # connection: one log line, not socketserver's traceback on stderr.
                err = sys.exc_info()[1]
                log.warning("webhook connection from %s failed: %s", client_address[0], err)

        self._server = Server((host, port), handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> WebhookServer:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def _handler(access: AccessCheck | None, trusted: frozenset[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that stops talking mid-request frees its thread
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in (PATH, MUTATE_PATH):
                self._send(
                    404, {"message": f"not found; the webhook answers POST {PATH}, {MUTATE_PATH}"}
                )
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                self._send(400, {"message": f"Content-Length must be 1..{MAX_BODY}"})
                return
            try:
                body = json.loads(self.rfile.read(length))
                if not isinstance(body, dict):
                    raise ValueError("expected a JSON object")
                answer = review(body, access) if path == PATH else mutation_review(body, trusted)
            except ValueError as err:
                self._send(400, {"message": str(err)})
                return
            self._send(200, answer)

        def _send(self, code: int, payload: Mapping[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("webhook %s: " + format, self.client_address[0], *args)

    return Handler
