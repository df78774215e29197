"""Failures of endpoints the orchestrator calls, classified into fixed words for tenants.

What an endpoint answers (an error body, a gRPC transport message) may echo what we sent it,
the bearer token included, or carry secrets of its own. Status, Events and conditions, which
tenants read, get only what this module builds: the endpoint's kind and name, a code (the HTTP
status or the gRPC code name) and a short reason chosen here, plus the fix where one is known.
The raw text goes to the controller's log only, after `redact` (the exact credentials sent to
that endpoint, `Authorization:` headers, `Bearer`/`Basic` values and `token=`-like pairs) and
truncated. Every caller classifies here, so one endpoint failure reads the same wherever it
surfaces: the orchestrator's health analysis, plugin calls, HTTP hooks and notifications, and
plugins whose messages reach a status (the contract: never secrets), e.g. KubeFleet's queries
of its central Prometheus. It lives in the SDK because plugins never import the orchestrator.
"""

from __future__ import annotations

import base64
import http.client
import logging
import re
import ssl
import urllib.error
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from plugins.sdk.client import PluginCallError

__all__ = [
    "LOG_HINT",
    "RAW_LIMIT",
    "Failure",
    "classify_exception",
    "classify_grpc",
    "classify_http",
    "display_address",
    "log_raw",
    "plugin_error_message",
    "redact",
    "url_secrets",
]

log = logging.getLogger(__name__)

#: Characters of an endpoint's raw answer kept in the log line (after redaction).
RAW_LIMIT = 500
_MASK = "***"


@dataclass(frozen=True)
class Failure:
    """One classified failure: a code ("HTTP 400", "UNAVAILABLE", "" for no answer at all),
    a fixed reason (its code included) and the fix where known."""

    code: str
    reason: str
    fix: str = ""

    def describe(self, kind: str, name: str) -> str:
        """The words a tenant reads: `MetricSource team-prom: unauthorized (HTTP 401); fix`."""
        where = f"{kind} {name}".strip()
        text = f"{where}: {self.reason}" if where else self.reason
        return f"{text}; {self.fix}" if self.fix else text


#: The fix of a failure whose explanation is only in what the endpoint said.
LOG_HINT = "the endpoint's answer is logged, not shown"


def classify_http(status: int, what: str = "request") -> Failure:
    """An HTTP answer that is not 2xx; `what` names what was sent ("query", "request")."""
    code = f"HTTP {status}"
    if 300 <= status < 400:
        return Failure(code, f"redirected ({code}); redirects are not followed", "")
    if status == 401:
        return Failure(
            code,
            f"unauthorized ({code})",
            "the endpoint does not accept the orchestrator's bearer token; its owner checks "
            "the token Secret",
        )
    if status == 403:
        return Failure(code, f"forbidden ({code})", "the endpoint's owner grants access")
    if status == 404:
        return Failure(code, f"not found ({code})", "check the endpoint's address and path")
    if status in (408, 504):
        return Failure(code, f"timeout ({code})", "")
    if status == 429:
        return Failure(code, f"rate limited ({code})", "")
    if 400 <= status < 500:
        return Failure(code, f"{what} rejected ({code})", LOG_HINT)
    if status == 503:
        return Failure(code, f"unavailable ({code})", "")
    if status >= 500:
        return Failure(code, f"server error ({code})", LOG_HINT)
    return Failure(code, f"answer not understood ({code})", LOG_HINT)


def classify_exception(err: BaseException, what: str = "request") -> Failure:
    """A failed HTTP call: urllib, ssl, socket and parsing errors in fixed words."""
    if isinstance(err, urllib.error.HTTPError):
        return classify_http(err.code, what)
    if isinstance(err, urllib.error.URLError):
        reason = err.reason
        if isinstance(reason, BaseException):
            return classify_exception(reason, what)
        return Failure("", "unreachable")
    if isinstance(err, ssl.SSLCertVerificationError):
        return Failure(
            "",
            "TLS verification failed",
            "the endpoint's certificate is not signed by the configured CA, or not for its name",
        )
    if isinstance(err, ssl.SSLError):
        return Failure("", "TLS handshake failed")
    if isinstance(err, TimeoutError):
        return Failure("", "timeout")
    if isinstance(err, http.client.InvalidURL):
        return Failure("", "address not valid")
    if isinstance(err, http.client.HTTPException | ValueError | KeyError | IndexError | TypeError):
        return Failure("", "answer not understood", LOG_HINT)
    if isinstance(err, OSError):
        return Failure("", "unreachable")
    return Failure("", f"failed ({type(err).__name__})")


def classify_grpc(code: str, details: str) -> Failure:
    """A gRPC failure the plugin did not answer itself (no ErrorInfo): the transport's."""
    text = details.lower()
    if code == "UNAVAILABLE":
        # "verif": CERTIFICATE_VERIFY_FAILED, and gRPC's "Hostname Verification Check failed"
        # (a serverName the certificate does not hold), which "verify" missed.
        if "certificate" in text or "verif" in text:
            return Failure(
                code,
                f"TLS verification failed ({code})",
                "the plugin's certificate is not signed by the configured CA, or not for its name",
            )
        if "ssl" in text or "tls" in text or "handshake" in text:
            return Failure(
                code,
                f"TLS handshake failed ({code})",
                "check that the plugin serves TLS (a plaintext one on loopback is named with "
                "insecure: true) and, if it asks for a client certificate, that "
                "tls.clientSecretName names one",
            )
        return Failure(
            code,
            f"unreachable ({code})",
            "check that the plugin runs and listens at this address (the FleetProvider's "
            "spec.endpoint, or spec.opsEndpoint.endpoint)",
        )
    fixed = {
        "DEADLINE_EXCEEDED": "timeout",
        "UNAUTHENTICATED": "unauthorized",
        "PERMISSION_DENIED": "forbidden",
        "UNIMPLEMENTED": "not implemented",
        "RESOURCE_EXHAUSTED": "rate limited",
        "CANCELLED": "cancelled",
    }
    if code in fixed:
        return Failure(code, f"{fixed[code]} ({code})")
    return Failure(code, f"answer not understood ({code})", LOG_HINT)


def plugin_error_message(err: PluginCallError, named: bool = True) -> str:
    """The words of a failed plugin call a tenant may read (named: a transport failure says
    which plugin, "plugin HOST:PORT: unreachable (UNAVAILABLE)").

    A plugin's own answer carries a google.rpc.ErrorInfo (docs/plugin-contract.md: every error
    a plugin answers does; its messages are deterministic and never secrets): its reason and
    message are kept. Without one the words came from the transport (a TLS failure, a proxy's
    answer, an HTTP server that is not a plugin): classified, and the raw text logged.
    """
    if err.domain:
        return f"{err.reason}: {err.message}" if err.reason else err.message
    failure = classify_grpc(err.code.name, err.message)
    log_raw(f"plugin {err.plugin}".strip() + f" {err.rpc}", failure, err.message)
    return failure.describe("plugin" if named and err.plugin else "", err.plugin if named else "")


def url_secrets(url: str) -> list[str]:
    """What of a URL may be a credential, for `redact`: the URL, its user info and password,
    its query string and each query value (a webhook's signature, an API key)."""
    out = [url]
    try:
        parts = urllib.parse.urlsplit(url)
        out += [parts.username or "", parts.password or "", parts.query]
        out += [v for _, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    except ValueError:
        pass
    return [v for v in out if v]


def display_address(address: str) -> str:
    """scheme://host[:port] of a URL: no credentials, path or query (they may be secret)."""
    try:
        parts = urllib.parse.urlsplit(address)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(address not valid)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}" if parts.scheme and host else "(address not valid)"


_AUTH_HEADER = re.compile(r"(?i)\b(proxy-)?authorization\b(\s*[\"']?\s*[:=]\s*[\"']?)[^\r\n\"']*")
_SCHEME_VALUE = re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=\-]+")
_SECRET_PAIR = re.compile(
    r"(?i)\b(access[_-]?token|api[_-]?key|token|password|passwd|secret|cookie|set-cookie)"
    r"(\s*[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&}]+"
)


def redact(raw: str | bytes, sent: Iterable[str | bytes] = (), limit: int = RAW_LIMIT) -> str:
    """raw, one line, with what we sent and anything shaped like a credential masked, cut to
    limit characters: safe for the controller's log (never for a status)."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    for value in _variants(sent):
        text = text.replace(value, _MASK)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1) or ''}Authorization{m.group(2)}{_MASK}", text)
    text = _SCHEME_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{_MASK}", text)
    text = _SECRET_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}{_MASK}", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _variants(sent: Iterable[str | bytes]) -> list[str]:
    """Each credential as sent, stripped, URL-quoted and base64'd; longest first, so a token
    inside a longer sent value (a URL holding it) is masked as a whole."""
    out: set[str] = set()
    for value in sent:
        text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
        text = text.strip()
        if len(text) < 4:  # masking "a" would mask every "a"
            continue
        out.add(text)
        out.add(urllib.parse.quote(text, safe=""))
        out.add(base64.b64encode(text.encode()).decode().rstrip("="))
    return sorted(out, key=len, reverse=True)


def log_raw(
    where: str,
    failure: Failure,
    raw: str | bytes,
    sent: Iterable[str | bytes] = (),
    logger: logging.Logger | None = None,
) -> None:
    """Log what an endpoint answered (redacted, truncated) next to its classification."""
    text = redact(raw, sent)
    (logger or log).warning(
        "%s: %s%s",
        where,
        failure.reason,
        f"; the endpoint answered: {text}" if text else "",
    )
