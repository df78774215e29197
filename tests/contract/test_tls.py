"""TLS and mTLS between the SDK client and server, with certificates the test generates."""

from __future__ import annotations

import grpc
import pytest

from plugins.sdk.client import ClientTLS, PluginCallError, PluginClient
from plugins.sdk.server import PluginServer, ServerTLS
from tests.contract.conftest import StartServer
from tests.support.certs import TestPKI
from tests.support.echo_plugin import echo_servicers

_FAST = {"GetPluginInfo": 3.0}


@pytest.fixture
def tls_server(start_server: StartServer, pki: TestPKI) -> PluginServer:
    return start_server(echo_servicers(), tls=ServerTLS(pki.server.cert_file, pki.server.key_file))


@pytest.fixture
def mtls_server(start_server: StartServer, pki: TestPKI) -> PluginServer:
    return start_server(
        echo_servicers(),
        tls=ServerTLS(pki.server.cert_file, pki.server.key_file, client_ca_file=pki.ca_file),
    )


def _info_error(client: PluginClient) -> PluginCallError:
    with client, pytest.raises(PluginCallError) as info:
        client.info()
    return info.value


def test_tls_client_trusting_the_ca_talks_to_the_server(
    tls_server: PluginServer, pki: TestPKI
) -> None:
    with PluginClient(tls_server.address, tls=ClientTLS(ca_file=pki.ca_file)) as client:
        assert client.info().name == "echo.test.fleetupgrade.io"
        assert len(client.list_clusters()) == 3


def test_tls_client_with_another_ca_is_refused(tls_server: PluginServer, pki: TestPKI) -> None:
    client = PluginClient(
        tls_server.address, tls=ClientTLS(ca_file=pki.other_ca_file), timeouts=_FAST
    )
    assert _info_error(client).code is grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_cannot_talk_to_a_tls_server(tls_server: PluginServer) -> None:
    client = PluginClient(tls_server.address, timeouts=_FAST)
    assert _info_error(client).code is grpc.StatusCode.UNAVAILABLE


def test_server_name_override_is_checked_against_the_certificate(
    tls_server: PluginServer, pki: TestPKI
) -> None:
    good = ClientTLS(ca_file=pki.ca_file, server_name="localhost")
    with PluginClient(tls_server.address, tls=good) as client:
        assert client.probe().ready
    wrong = ClientTLS(ca_file=pki.ca_file, server_name="elsewhere.example")
    error = _info_error(PluginClient(tls_server.address, tls=wrong, timeouts=_FAST))
    assert error.code is grpc.StatusCode.UNAVAILABLE


def test_mtls_accepts_a_client_certificate_from_the_ca(
    mtls_server: PluginServer, pki: TestPKI
) -> None:
    tls = ClientTLS(pki.ca_file, pki.client.cert_file, pki.client.key_file)
    with PluginClient(mtls_server.address, tls=tls) as client:
        assert client.info().vendor_version == "0.1.0"


def test_mtls_accepts_certificates_given_as_pem_bytes(
    mtls_server: PluginServer, pki: TestPKI
) -> None:
    tls = ClientTLS.from_pem(pki.ca_pem, pki.client.cert_pem, pki.client.key_pem)
    assert "key_pem" not in repr(tls) and "PRIVATE KEY" not in repr(tls)
    with PluginClient(mtls_server.address, tls=tls) as client:
        assert client.info().vendor_version == "0.1.0"


def test_mtls_rejects_a_client_without_a_certificate(
    mtls_server: PluginServer, pki: TestPKI
) -> None:
    client = PluginClient(mtls_server.address, tls=ClientTLS(ca_file=pki.ca_file), timeouts=_FAST)
    error = _info_error(client)
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.retryable


def test_mtls_rejects_a_client_certificate_from_another_ca(
    mtls_server: PluginServer, pki: TestPKI
) -> None:
    tls = ClientTLS(pki.ca_file, pki.stranger.cert_file, pki.stranger.key_file)
    error = _info_error(PluginClient(mtls_server.address, tls=tls, timeouts=_FAST))
    assert error.code is grpc.StatusCode.UNAVAILABLE


def test_client_certificate_without_key_is_a_clear_error(pki: TestPKI) -> None:
    with pytest.raises(ValueError, match=r"tls\.key_file"):
        PluginClient("127.0.0.1:1", tls=ClientTLS(pki.ca_file, cert_file=pki.client.cert_file))


def test_unreadable_ca_file_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"tls\.ca_file"):
        PluginClient("127.0.0.1:1", tls=ClientTLS(ca_file="/nonexistent/ca.crt"))
