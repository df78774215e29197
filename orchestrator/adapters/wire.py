"""Kept-alive HTTP/1.1 connections to the apiserver for requests answered whole.

The hot path of a rollout is one ClusterUpgrade status write per cluster step: a JSON patch of
1-2 KiB and an answer of about as much. Through urllib3 (its pool, `HTTPConnection`,
http.client's request writer and its header parser, built on the `email` package) a write
cost 0.32-0.37 ms of client CPU at 32 writers on this machine; the same exchange over a kept
socket, the request written as one buffer and the answer's head parsed for the three fields
HTTP/1.1 needs (status, Content-Length or chunked Transfer-Encoding, Connection), 0.11-0.16 ms
(issue 21). Watches (answers read as a stream) and requests through a proxy stay on urllib3.

What HTTP/1.1 asks of a client here (RFC 9112): a request is `METHOD target HTTP/1.1`, its
header fields and Content-Length (section 3, 6.2); an answer's body is chunked when
Transfer-Encoding says so, else Content-Length bytes, else everything up to the close (6.3);
an interim 1xx answer comes before the final one (RFC 9110 15.2); a connection is kept unless
either side says `Connection: close` or the answer is HTTP/1.0 (9.3). As urllib3 does
(`HTTPConnectionPool._get_conn`, `util.connection.is_connection_dropped`), a kept connection
the server has closed or written to while idle is dropped before it is used; as Go's net/http
Transport does (`persistConn.shouldRetryRequest`), only a GET is sent again when a kept
connection fails under it, never a write.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import threading
import time
import warnings

from urllib3.exceptions import InsecureRequestWarning
from urllib3.util.wait import wait_for_read

__all__ = ["Answer", "Connections", "WireError", "head_block"]

#: The most an answer's head may be (the apiserver's are a few hundred bytes).
MAX_HEAD_BYTES = 64 * 1024
#: Bytes asked of the socket per read.
READ_BYTES = 64 * 1024
#: Request bodies up to this size go out with their head in one write (a status write's patch
#: is 1-2 KiB; a TLS record holds 16 KiB); larger ones in two (head, then body).
ONE_WRITE_BYTES = 16 * 1024
#: Idle connections kept at most (the writers of a pass and the other threads' requests).
KEPT = 64
#: A character that cannot be in a request target or a header value (controls, space in a
#: target, CR/LF anywhere): sending one would change what the request says.
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class WireError(Exception):
    """The exchange failed (connect, TLS, timeout, a closed or malformed answer); the message
    says how, never a header's value."""


class Answer:
    """An answer read whole: status, reason and body bytes."""

    __slots__ = ("data", "reason", "status")

    def __init__(self, status: int, reason: str, data: bytes) -> None:
        self.status = status
        self.reason = reason
        self.data = data


def head_block(netloc: str, headers: dict[str, str]) -> bytes:
    """The header fields every request of a kind carries (Host first), as bytes to send after
    the request line; built once per content type and credential. Raises WireError when a
    value holds a line break or control character (it would end the field early: the name of
    the field is said, not its value)."""
    lines = [f"Host: {netloc}\r\n"]
    for name, value in headers.items():
        if _BAD_VALUE.search(value) or _BAD_VALUE.search(name) or ":" in name:
            raise WireError(
                f"the request header {name!r} has a line break or control character in its "
                "value; fix the credential or setting it comes from (kubeconfig user, token file)"
            )
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


class _Conn:
    """One socket and what was read from it past the last answer."""

    __slots__ = ("buf", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Closed(WireError):
    """The server closed the connection before any byte of the answer."""


class Connections:
    """Kept-alive connections to one apiserver address (TLS when tls is given), shared by the
    threads that make requests: each request takes an idle one (or opens one) and gives it
    back when its answer was read whole and the connection may be kept."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> None:
        self._address = (host, port)
        self._tls = tls
        #: The name the certificate is checked for (tls-server-name, else the host).
        self._server_hostname = server_hostname or host
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        #: After `close`, a connection given back (its request was in flight) is closed too.
        self._closed = False
        #: Connections opened in all (tests and the benchmark read it).
        self.opened = 0

    def close(self) -> None:
        """Close every idle connection now (one in use is closed when its request ends)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def idle_sockets(self) -> list[socket.socket]:
        """The sockets of the idle connections (tests)."""
        with self._lock:
            return [c.sock for c in self._idle]

    def request(
        self, method: str, target: str, head: bytes, body: bytes | None, timeout: float
    ) -> Answer:
        """Send one request (target: path and query; head: `head_block`'s) and read its
        answer whole within timeout seconds. Raises WireError when there is no answer (its
        message says why; the caller names the request)."""
        if _BAD_TARGET.search(target):
            raise WireError("the request path has a space or control character")
        deadline = time.monotonic() + timeout
        length = 0 if body is None else len(body)
        line = f"{method} {target} HTTP/1.1\r\n".encode("latin-1")
        request = line + head + b"Content-Length: %d\r\n\r\n" % length
        for attempt in range(2):
            conn, kept = self._take(deadline)
            try:
                conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
                if body is not None and length <= ONE_WRITE_BYTES:
                    conn.sock.sendall(request + body)
                else:
                    conn.sock.sendall(request)
                    if body:
                        conn.sock.sendall(body)
                answer, keep = _read_answer(conn, method, deadline)
            except _Closed as err:
                conn.close()
                if kept and attempt == 0 and method == "GET":
                    continue  # a kept connection closed under a read: once more, on a new one
                raise WireError(str(err)) from None
            except (OSError, ValueError, WireError) as err:  # socket, TLS, timeout, malformed
                conn.close()
                raise WireError(_describe(err)) from None
            except BaseException:
                conn.close()
                raise
            if keep and not conn.buf:
                self._give(conn)
            else:
                conn.close()
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _take(self, deadline: float) -> tuple[_Conn, bool]:
        """An idle connection still open (and whether it was kept), else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open(deadline), False
            # Readable while idle: closed by the server (or it wrote unasked): not usable.
            if wait_for_read(conn.sock, timeout=0.0):
                conn.close()
                continue
            return conn, True

    def _give(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < KEPT:
                self._idle.append(conn)
                return
        conn.close()

    def _open(self, deadline: float) -> _Conn:
        left = max(0.001, deadline - time.monotonic())
        try:
            sock = socket.create_connection(self._address, timeout=left)
        except OSError as err:
            raise WireError(
                f"cannot connect to {self._address[0]}:{self._address[1]}: {err}"
            ) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_hostname)
                if self._tls.verify_mode == ssl.CERT_NONE:
                    # As urllib3 says it of every unverified connection (insecure-skip-tls-verify).
                    warnings.warn(
                        f"Unverified HTTPS request is being made to host '{self._address[0]}'. "
                        "Adding certificate verification is strongly advised.",
                        InsecureRequestWarning,
                        stacklevel=2,
                    )
        except OSError as err:
            sock.close()
            raise WireError(f"{self._address[0]}:{self._address[1]}: {err}") from None
        with self._lock:
            self.opened += 1
        return _Conn(sock)


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__


def _more(conn: _Conn, deadline: float) -> bool:
    """Read what the socket has into conn.buf, waiting until deadline at most; False when
    the connection closed (nothing more will come)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    conn.sock.settimeout(left)
    chunk = conn.sock.recv(READ_BYTES)
    conn.buf += chunk
    return bool(chunk)


def _fill(conn: _Conn, deadline: float, started: bool) -> None:
    """`_more` where the answer must go on. started: some of the answer was read already (a
    close now cuts it short, not before it began)."""
    if not _more(conn, deadline):
        if started:
            raise WireError("the connection closed in the middle of the answer")
        raise _Closed("the connection closed before the answer")


def _line(conn: _Conn, deadline: float) -> bytes:
    """One CRLF-ended line of the answer (a chunk's size or a trailer field)."""
    end = conn.buf.find(b"\r\n")
    while end < 0:
        if len(conn.buf) > MAX_HEAD_BYTES:
            raise WireError("a line of the answer is too long")
        _fill(conn, deadline, True)
        end = conn.buf.find(b"\r\n")
    line = bytes(conn.buf[:end])
    del conn.buf[: end + 2]
    return line


def _exactly(conn: _Conn, size: int, deadline: float) -> bytes:
    while len(conn.buf) < size:
        _fill(conn, deadline, True)
    data = bytes(conn.buf[:size])
    del conn.buf[:size]
    return data


def _read_answer(conn: _Conn, method: str, deadline: float) -> tuple[Answer, bool]:
    """The final answer to the request just sent (1xx answers skipped), and whether the
    connection may be kept after it."""
    buf = conn.buf
    started = False
    while True:
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise WireError("the answer's head is too large")
            _fill(conn, deadline, started)
            started = True
            end = buf.find(b"\r\n\r\n")
        lines = bytes(buf[:end]).split(b"\r\n")
        del buf[: end + 4]
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise WireError(f"not an HTTP/1.1 answer: {lines[0][:40]!r}")
        status = int(code)
        fields: dict[bytes, bytes] = {}
        for raw in lines[1:]:
            name, sep, value = raw.partition(b":")
            if not sep:
                raise WireError("a malformed field in the answer's head")
            key = name.strip().lower()
            value = value.strip()
            if key in fields and key == b"content-length" and fields[key] != value:
                raise WireError("the answer has two different Content-Lengths")
            fields[key] = value if key not in fields else fields[key] + b", " + value
        if 100 <= status < 200:
            started = True
            continue
        break
    keep = version == b"HTTP/1.1" and b"close" not in fields.get(b"connection", b"").lower()
    if method == "HEAD" or status in (204, 304):
        data = b""
    elif b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        data = _chunked(conn, deadline)
    elif b"content-length" in fields:
        length = fields[b"content-length"]
        if not length.isdigit():
            raise WireError("the answer's Content-Length is not a number")
        data = _exactly(conn, int(length), deadline)
    else:  # the body ends with the connection (RFC 9112 6.3, last case)
        while _more(conn, deadline):
            pass
        data, keep = bytes(buf), False
        buf.clear()
    return Answer(status, reason.decode("latin-1"), data), keep


def _chunked(conn: _Conn, deadline: float) -> bytes:
    """A chunked body (RFC 9112 7.1): sizes in hex, each chunk followed by CRLF, a zero-size
    chunk, trailer fields (ignored) and an empty line."""
    out = bytearray()
    while True:
        size_field = _line(conn, deadline).split(b";", 1)[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError:
            raise WireError("a malformed chunk size in the answer") from None
        if size == 0:
            while _line(conn, deadline):
                pass
            return bytes(out)
        chunk = _exactly(conn, size + 2, deadline)
        if chunk[-2:] != b"\r\n":
            raise WireError("a chunk of the answer does not end where its size says")
        out += chunk[:-2]
