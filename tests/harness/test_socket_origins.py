"""tests/support/socket_origins: a test failed by an unclosed TLS socket's ResourceWarning
reports where that socket was opened."""

from __future__ import annotations

import socket
import ssl

from tests.support.socket_origins import opened_at


def _open_tls_socket() -> ssl.SSLSocket:
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.bind(("127.0.0.1", 0))
    return ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")


def test_the_warning_text_leads_to_the_stack_that_opened_the_socket() -> None:
    sock = _open_tls_socket()
    try:
        port = sock.getsockname()[1]
        text = (
            "ResourceWarning: unclosed <ssl.SSLSocket fd=29, family=2, type=1, proto=6, "
            f"laddr=('127.0.0.1', {port})>"
        )
        [(found, origin)] = opened_at(text)
        assert found == port
        assert "_open_tls_socket" in origin and "test_socket_origins.py" in origin
        test = "tests/harness/test_socket_origins.py::test_the_warning_text_leads_to_the_stack"
        assert origin.startswith(f"during {test}") and ", thread MainThread:" in origin
    finally:
        sock.close()


def test_text_without_an_unclosed_socket_names_none() -> None:
    assert opened_at("AssertionError: 3 != 4") == []
    [(port, origin)] = opened_at("unclosed <ssl.SSLSocket fd=3, laddr=('127.0.0.1', 1)>")
    assert port == 1 and origin.startswith("not recorded")
