"""Fixtures of the contract tests: a generated test PKI, in-process plugin servers, and the sim
plugin with a client of it (a module sets its options by overriding `sim_options`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from orchestrator.adapters.provider import GrpcProvider, OperationTracker
from plugins.sdk.client import PluginClient
from plugins.sdk.server import PluginServer, PluginServicers, ServerTLS, serve
from plugins.sim import SimOptions, Simulator
from tests.support.certs import TestPKI, generate_pki

StartServer = Callable[..., PluginServer]


def grpc_provider(client: PluginClient) -> GrpcProvider:
    """The orchestrator's adapter over client, its operations tracked, on the wall clock."""
    return GrpcProvider(
        client, OperationTracker(lambda plugin, op: None), clock=lambda: datetime.now(UTC)
    )


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    """A CA, server cert (127.0.0.1, localhost), client cert and a stranger's client cert."""
    return generate_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh prometheus registry, so metric values start at zero."""
    return CollectorRegistry()


@pytest.fixture
def start_server(registry: CollectorRegistry) -> Iterator[StartServer]:
    """Starts plugin servers on 127.0.0.1:0; each is stopped when the test ends."""
    servers: list[PluginServer] = []

    def start(
        servicers: PluginServicers,
        *,
        tls: ServerTLS | None = None,
        plugin_name: str = "test",
        enforce_capabilities: bool = True,
    ) -> PluginServer:
        server = serve(
            "127.0.0.1:0",
            servicers,
            tls=tls,
            plugin_name=plugin_name,
            registry=registry,
            enforce_capabilities=enforce_capabilities,
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace=0.5)


@pytest.fixture
def sim_options() -> SimOptions:
    """The options of `sim`; a test module overrides this fixture to change them."""
    return SimOptions(generate=2, step_seconds=0.3, seed=3, registry=CollectorRegistry())


@pytest.fixture
def sim(sim_options: SimOptions) -> Iterator[Simulator]:
    """The sim plugin, served in process; stopped when the test ends."""
    sim = Simulator(sim_options)
    yield sim
    sim.stop(grace=0)


@pytest.fixture
def client(sim: Simulator) -> Iterator[PluginClient]:
    """A client of `sim`, named "test"."""
    client = PluginClient(sim.address, caller="test")
    yield client
    client.close()


@pytest.fixture
def echo_client(start_server: StartServer) -> Iterator[PluginClient]:
    """A client of the echo plugin (two clusters), which offers none of the optional batch
    RPCs (StartOperations, PreflightUpgrades)."""
    from tests.support.echo_plugin import echo_servicers

    with PluginClient(start_server(echo_servicers(2)).address) as client:
        yield client
