"""The OCM hub's mutating admission webhook on ManagedCluster, served to the test apiserver.

It mirrors open-cluster-management-io/ocm pkg/registration/webhook/v1/managedcluster_mutating.go
(processTaints; read at commit 5fd730f), the rule that decides whether a taint write takes effect:

- CREATE: every taint gets timeAdded = now (a timeAdded sent is ignored);
- UPDATE, a taint whose key the old object does not have: DENIED if it carries timeAdded,
  else stamped now;
- UPDATE, same key with the same value and effect: DENIED if timeAdded differs from the old one;
- UPDATE, same key with another value or effect: DENIED if it carries timeAdded, else stamped.

The old taint is found by key only (pkg/registration/helpers FindTaintByKey: the first taint of
the old object with that key, whatever its value), exactly as here. The
denial is a 400 with "It is not allowed to set TimeAdded of Taint \"<keys>\"." The upstream
webhook also adds the default ManagedClusterSet label (feature gate DefaultClusterSet); that
does not decide whether our writes take effect and is not mirrored. It is registered with
failurePolicy Fail, as OCM registers it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.support.certs import generate_pki
from tests.support.kube import KubeCluster

__all__ = ["WEBHOOK_NAME", "managed_cluster_webhook", "process_taints"]

WEBHOOK_NAME = "managedclustermutators.admission.cluster.open-cluster-management.io"


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def process_taints(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, now: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """(JSON patch operations, keys of denied taints) for one admission request."""
    taints = (new.get("spec") or {}).get("taints") or []
    old_taints = ((old or {}).get("spec") or {}).get("taints") or []
    patch: list[dict[str, Any]] = []
    invalid: list[str] = []
    for index, taint in enumerate(taints):
        stamp = {"op": "add", "path": f"/spec/taints/{index}/timeAdded", "value": now}
        original = next((t for t in old_taints if t.get("key") == taint.get("key")), None)
        if old is None:
            patch.append(stamp)
        elif original is None or (
            original.get("value", "") != taint.get("value", "")
            or original.get("effect") != taint.get("effect")
        ):
            if _time(taint.get("timeAdded")) is not None:
                invalid.append(str(taint.get("key")))
                continue
            patch.append(stamp)
        elif _time(original.get("timeAdded")) != _time(taint.get("timeAdded")):
            invalid.append(str(taint.get("key")))
    return patch, invalid


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        request = review.get("request") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch, invalid = process_taints(request.get("object") or {}, request.get("oldObject"), now)
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": not invalid}
        if invalid:
            keys = ",".join(invalid)
            response["status"] = {
                "code": 400,
                "reason": "BadRequest",
                "message": f'It is not allowed to set TimeAdded of Taint "{keys}".',
            }
            with self.server.lock:
                self.server.denied.append(keys)
        elif patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.denied: list[str] = []


@contextlib.contextmanager
def managed_cluster_webhook(hub: KubeCluster, workdir: Path) -> Iterator[list[str]]:
    """Serves the webhook over HTTPS and registers it on the hub; yields the denied keys."""
    pki = generate_pki(workdir)
    server = _Server()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server.cert_file, pki.server.key_file)
    # The handshake happens in the handler's thread (on first read): a failed one then ends
    # in the server's shutdown_request, which closes the socket, instead of leaking it in
    # accept().
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    thread = threading.Thread(target=server.serve_forever, name="ocm-webhook", daemon=True)
    thread.start()
    port = server.server_address[1]
    api = hub.api_client()
    admission = k8s.AdmissionregistrationV1Api(api)
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/mutate-cluster-open-cluster-management-io-v1-managedcluster",
                    "caBundle": base64.b64encode(pki.ca_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["cluster.open-cluster-management.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["managedclusters"],
                    }
                ],
            }
        ],
    }
    with contextlib.suppress(ApiException):
        admission.delete_mutating_webhook_configuration(WEBHOOK_NAME)
    admission.create_mutating_webhook_configuration(config)
    try:
        yield server.denied
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(WEBHOOK_NAME)
        api.close()
        server.shutdown()
        server.server_close()
