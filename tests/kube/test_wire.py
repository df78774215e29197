"""orchestrator.adapters.wire, the kept-alive HTTP/1.1 path of every request answered whole
(issue 21): against the real apiserver, parallel conditional status writes land whole over
kept connections; against a scripted server on loopback, what HTTP/1.1 lets a server answer
(chunked bodies, a body ended by the close, interim 1xx answers, `Connection: close`) is read
right, a connection the server closed while idle is never written on, a write is never sent
twice, and bad header values and silent servers give clear errors."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from urllib3.util.wait import wait_for_read

from orchestrator import api
from orchestrator.adapters import wire
from orchestrator.adapters.kube import KubeClient, KubeError
from tests.kube.test_kube_client import upgrade_body
from tests.support.kube import KubeCluster

CU = api.CLUSTER_UPGRADE_PLURAL
HEAD = wire.head_block("127.0.0.1", {"Accept": "application/json"})

#: What the scripted server does with one request on a connection: the answer's bytes, or
#: None to close the connection without answering.
Script = Callable[[bytes, bytes], bytes | None]


class Scripted:
    """A loopback HTTP/1.1 server that answers each request with what its script says and
    records every request it read (head line and body), per connection."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[int, bytes, bytes]] = []  # (connection, request line, body)
        self.connections = 0
        self.sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self.sockets.append(sock)
            number = self.connections
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        buf = b""
        with sock:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = sock.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += sock.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append((number, lines[0], body))
                answer = self.script(lines[0], body)
                if answer is None:
                    return
                sock.sendall(answer)
                if b"\r\nConnection: close\r\n" in answer.partition(b"\r\n\r\n")[0] + b"\r\n":
                    return

    def close(self) -> None:
        self._stop = True
        self._listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Script], tuple[Scripted, wire.Connections]]]:
    made: list[tuple[Scripted, wire.Connections]] = []

    def start(script: Script) -> tuple[Scripted, wire.Connections]:
        server = Scripted(script)
        made.append((server, wire.Connections("127.0.0.1", server.port, None, None)))
        return made[-1]

    yield start
    for server, conns in made:
        conns.close()
        server.close()


def _ok(body: bytes, *fields: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body) + b"".join(fields)
    return head + b"\r\n" + body


def test_status_writes_from_many_threads_land_whole_over_kept_connections(
    control_plane: KubeCluster, namespace: str
) -> None:
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        names = [f"cu-{i}" for i in range(40)]
        versions = {
            n: kube.create_object(CU, namespace, upgrade_body(n))["metadata"]["resourceVersion"]
            for n in names
        }

        def write(name: str, round_: int) -> None:
            status = {"phase": "Verifying", "message": f"{name} round {round_} " + "x" * 900}
            answer = kube.write_status(CU, namespace, name, status, versions[name])
            assert answer["status"] == status
            versions[name] = answer["metadata"]["resourceVersion"]

        with ThreadPoolExecutor(16) as pool:
            for round_ in range(5):
                list(pool.map(write, names, [round_] * len(names)))
        assert kube._wire is not None
        opened = kube._wire.opened
        # Each of the 200 writes landed, in order, on the object the server keeps.
        listed = {o["metadata"]["name"]: o for o in kube.list_objects(CU, namespace)[0]}
        for name in names:
            assert listed[name]["status"]["message"].startswith(f"{name} round 4 ")
            assert listed[name]["metadata"]["resourceVersion"] == versions[name]
        # Connections were kept: at most one per thread at once, not one per request.
        assert 1 <= opened <= 17
    finally:
        kube.close()


def test_chunked_bodies_interim_answers_and_a_body_ended_by_the_close_are_read_whole(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    def script(line: bytes, body: bytes) -> bytes | None:
        if line.startswith(b"GET /chunked"):
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'5;ext=1\r\n{"a":\r\n'
                b"3\r\n 12\r\n1\r\n}\r\n0\r\nTrailer-Field: x\r\n\r\n"
            )
        if line.startswith(b"GET /interim"):
            return b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b'{"b":2}')
        if line.startswith(b"GET /close"):
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            return head + b"\r\n" + b'{"c":3}'
        return _ok(b"{}")

    server, conns = serve(script)
    chunked = conns.request("GET", "/chunked", HEAD, None, 5)
    assert (chunked.status, chunked.data) == (200, b'{"a": 12}')
    interim = conns.request("GET", "/interim", HEAD, None, 5)
    assert (interim.status, interim.reason, interim.data) == (200, "OK", b'{"b":2}')
    # Both on the first connection, kept; the body ended by the close is read to the close
    # and its connection not kept.
    assert [r[0] for r in server.requests] == [1, 1]
    ended = conns.request("GET", "/close", HEAD, None, 5)
    assert ended.data == b'{"c":3}'
    assert conns.idle_sockets() == []
    assert conns.request("GET", "/after", HEAD, None, 5).data == b"{}"
    assert [r[0] for r in server.requests] == [1, 1, 1, 2]


def test_connection_close_is_honoured_and_a_body_goes_out_with_its_length(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    server, conns = serve(lambda line, body: _ok(body, b"Connection: close\r\n"))
    first = conns.request("PATCH", "/a", HEAD, b'[{"op":"add"}]', 5)
    second = conns.request("POST", "/b", HEAD, b"x" * 40_000, 5)  # past one write's size
    assert first.data == b'[{"op":"add"}]' and second.data == b"x" * 40_000
    assert [(r[0], r[1]) for r in server.requests] == [
        (1, b"PATCH /a HTTP/1.1"),
        (2, b"POST /b HTTP/1.1"),
    ]
    assert conns.idle_sockets() == []


def test_a_connection_the_server_closed_while_idle_is_not_written_on(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    server, conns = serve(lambda line, body: _ok(b"{}"))
    conns.request("GET", "/one", HEAD, None, 5)
    assert len(conns.idle_sockets()) == 1
    for sock in server.sockets:  # the server's idle timeout
        sock.shutdown(socket.SHUT_RDWR)
    assert wait_for_read(conns.idle_sockets()[0], timeout=5)  # its close has arrived
    answer = conns.request("PATCH", "/two", HEAD, b"[]", 5)
    assert answer.status == 200
    assert [(r[0], r[1]) for r in server.requests] == [
        (1, b"GET /one HTTP/1.1"),
        (2, b"PATCH /two HTTP/1.1"),
    ]


def test_a_write_whose_connection_closes_unanswered_is_not_sent_again_a_read_is(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    def script(line: bytes, body: bytes) -> bytes | None:
        return None if line.split(b" ")[1].startswith(b"/drop") else _ok(b"{}")

    server, conns = serve(script)
    conns.request("GET", "/warm", HEAD, None, 5)
    with pytest.raises(wire.WireError, match="closed before the answer"):
        conns.request("PATCH", "/drop-write", HEAD, b"[]", 5)
    patches = [r for r in server.requests if r[1].startswith(b"PATCH")]
    assert len(patches) == 1  # the server saw the write once: it may have applied it
    # A GET on a kept connection that closes unanswered is asked once more, on a new one.
    conns.request("GET", "/warm", HEAD, None, 5)
    with pytest.raises(wire.WireError):
        conns.request("GET", "/drop-read", HEAD, None, 5)
    reads = [r for r in server.requests if r[1].startswith(b"GET /drop-read")]
    assert len(reads) == 2 and reads[0][0] != reads[1][0]


def test_a_silent_server_times_out_and_its_connection_is_dropped(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    silent = threading.Event()

    def script(line: bytes, body: bytes) -> bytes | None:
        silent.wait(10)
        return None

    _, conns = serve(script)
    try:
        with pytest.raises(wire.WireError, match="timed out"):
            conns.request("GET", "/slow", HEAD, None, 0.3)
        assert conns.idle_sockets() == []
    finally:
        silent.set()


def test_a_header_value_or_path_that_would_change_the_request_is_refused(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    token = "secret-token\r\nX-Injected: yes"
    with pytest.raises(wire.WireError) as bad:
        wire.head_block("127.0.0.1", {"Authorization": f"Bearer {token}"})
    assert "'Authorization'" in str(bad.value) and "credential" in str(bad.value)
    assert "secret-token" not in str(bad.value)
    server, conns = serve(lambda line, body: _ok(b"{}"))
    with pytest.raises(wire.WireError, match="space or control character"):
        conns.request("GET", "/a b HTTP/1.1\r\nX: y", HEAD, None, 5)
    assert server.requests == []


def test_a_malformed_answer_is_an_error_naming_what_is_wrong(
    serve: Callable[[Script], tuple[Scripted, wire.Connections]],
) -> None:
    _, conns = serve(lambda line, body: b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(wire.WireError, match=r"not an HTTP/1\.1 answer"):
        conns.request("GET", "/", HEAD, None, 5)


def test_the_kube_client_says_which_request_failed_without_the_credential(
    control_plane: KubeCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        assert kube._wire is not None
        monkeypatch.setattr(kube._wire, "_address", ("127.0.0.1", 1))  # nothing listens
        with pytest.raises(KubeError) as refused:
            kube.get_object(CU, namespace, "cu")
        assert refused.value.status == 0
        assert f"GET /apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/" in str(refused.value)
        assert "cannot connect to 127.0.0.1:1" in str(refused.value)
    finally:
        kube.close()


def test_the_kube_client_reaches_an_ipv6_literal_server_with_its_host_header(
    tmp_path: Path,
) -> None:
    seen: list[bytes] = []

    def answer(sock: socket.socket) -> None:
        with sock:
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            seen.append(head)
            sock.sendall(_ok(b'{"metadata": {"name": "cu"}}', b"Connection: close\r\n"))

    listener = socket.create_server(("::1", 0), family=socket.AF_INET6)
    port = listener.getsockname()[1]
    server = threading.Thread(target=lambda: answer(listener.accept()[0]), daemon=True)
    server.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "v6",
        "clusters": [{"name": "v6", "cluster": {"server": f"http://[::1]:{port}"}}],
        "users": [{"name": "v6", "user": {"token": "t"}}],
        "contexts": [{"name": "v6", "context": {"cluster": "v6", "user": "v6"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    kube = KubeClient(str(path))
    try:
        assert kube.get_object(CU, "ns", "cu") == {"metadata": {"name": "cu"}}
    finally:
        kube.close()
        listener.close()
    server.join(5)
    assert f"\r\nHost: [::1]:{port}\r\n".encode() in seen[0]
