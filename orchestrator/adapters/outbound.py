"""The one HTTP client for endpoints people configure (hooks, notifications): POST with a bound.

TLS is verified against the CA bundle a Secret holds (the system's otherwise), and redirects are
refused: a 3xx is an answer, not an instruction, so a receiver cannot send the body and its
bearer token elsewhere. An HTTP error answer is returned, not raised, with its body unread
unless the caller asks for the first bytes (for its log only: a receiver may echo the token).
What to retry, and how, is the caller's (a hook retries within its own timeout; a notification
is queued again with backoff); the words of any error are the caller's too, since urllib's may
quote the URL.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "opener", "post"]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answers, not instructions: a 3xx is returned as the answer."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass(frozen=True)
class Answer:
    """What the endpoint answered."""

    status: int
    #: The first bytes of an error answer's body when asked for (log it only through
    #: plugins.sdk.endpoint_errors.log_raw); empty otherwise.
    body: bytes = b""

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return 200 <= self.status < 300


def opener(ca_pem: str | None) -> urllib.request.OpenerDirector:
    """An opener that verifies TLS against ca_pem (None: the system's CAs) and follows no
    redirect. Raises ssl.SSLError when ca_pem is not a PEM bundle."""
    context = ssl.create_default_context(cadata=ca_pem) if ca_pem else None
    return urllib.request.build_opener(_NoRedirect(), urllib.request.HTTPSHandler(context=context))


def post(
    via: urllib.request.OpenerDirector,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    *,
    drain: int = 0,
    error_bytes: int = 0,
) -> Answer:
    """POST body to url within timeout seconds.

    drain: bytes of a 2xx answer's body read before the connection closes. error_bytes: bytes
    of an error answer's body read into Answer.body (0: closed unread). Raises ValueError or
    http.client.InvalidURL for a malformed URL or header, urllib.error.URLError or OSError
    when no answer came (a refused connection, a timeout, a TLS failure).
    """
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with via.open(request, timeout=timeout) as answer:
            if drain:
                answer.read(drain)
            return Answer(int(answer.status))
    except urllib.error.HTTPError as err:
        with err:
            raw = err.read(error_bytes) if error_bytes else b""
        return Answer(err.code, raw)
