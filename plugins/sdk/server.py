"""Plugin server bootstrap: services, grpc.health.v1, reflection, TLS/mTLS, graceful shutdown."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Generic, Protocol, TypedDict, TypeVar

import grpc
import grpc_health.v1.health as std_health
import grpc_health.v1.health_pb2 as std_health_pb2
import grpc_health.v1.health_pb2_grpc as std_health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
)
from plugins.sdk.client import RPC_CAPABILITIES, supports
from plugins.sdk.interceptors import JsonFormatter, RpcInterceptor, rpc_metrics
from plugins.sdk.servicers import ClusterServicer

__all__ = [
    "CLUSTER_SERVICE",
    "GATE_SERVICE",
    "HEALTH_SERVICE",
    "IDENTITY_SERVICE",
    "FleetServer",
    "PluginServer",
    "PluginServicers",
    "ServedFleet",
    "ServerTLS",
    "add_server_args",
    "configure_logging",
    "run_until_signal",
    "serve",
    "server_tls_from_args",
    "start_metrics_server",
]

IDENTITY_SERVICE: str = identity_pb2.DESCRIPTOR.services_by_name["IdentityService"].full_name
CLUSTER_SERVICE: str = cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name
HEALTH_SERVICE: str = health_pb2.DESCRIPTOR.services_by_name["HealthService"].full_name
GATE_SERVICE: str = gate_pb2.DESCRIPTOR.services_by_name["GateService"].full_name

_LOG = logging.getLogger("plugins.sdk.server")
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "[::]", "", "::"})


@dataclass(frozen=True)
class ServerTLS:
    """Certificate files of a TLS server; client_ca_file set means mTLS (client certs required)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """Reads the files and builds the server credentials."""
        cert = _read_pem("--tls-cert", self.cert_file)
        key = _read_pem("--tls-key", self.key_file)
        ca = _read_pem("--tls-client-ca", self.client_ca_file) if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )


@dataclass
class PluginServicers:
    """The services a plugin implements; None means the service is not offered."""

    identity: identity_pb2_grpc.IdentityServiceServicer
    cluster: cluster_pb2_grpc.ClusterServiceServicer | None = None
    health: health_pb2_grpc.HealthServiceServicer | None = None
    gate: gate_pb2_grpc.GateServiceServicer | None = None


class PluginServer:
    """A started plugin server: its bound port and address, stop and wait."""

    def __init__(
        self,
        server: grpc.Server,
        health_servicer: std_health.HealthServicer,
        port: int,
        address: str,
    ) -> None:
        self._server = server
        self._health = health_servicer
        self._stopped = threading.Event()
        self._on_stop: list[Callable[[], None]] = []
        self.port = port
        self.address = address

    def add_stop_callback(self, callback: Callable[[], None]) -> None:
        """Runs callback when stop() begins, e.g. OperationStore.close to end watch streams."""
        self._on_stop.append(callback)

    def stop(self, grace: float = 5.0) -> None:
        """Reports NOT_SERVING, lets in-flight RPCs finish for up to grace seconds, stops.

        Streams still open when grace runs out are cancelled; stop callbacks run first so a
        plugin can end its own streams cleanly.
        """
        self._health.enter_graceful_shutdown()
        for callback in self._on_stop:
            try:
                callback()
            except Exception:
                _LOG.exception("stop callback failed")
        self._server.stop(grace).wait()
        self._stopped.set()

    def wait(self) -> None:
        """Blocks until the server has stopped."""
        self._server.wait_for_termination()

    @property
    def stopped(self) -> bool:
        """True once stop() has completed."""
        return self._stopped.is_set()


def _read_pem(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag}: cannot read {path!r} ({exc.strerror}); pass a PEM file") from exc


def _reachable_address(listen: str, port: int) -> str:
    if listen.startswith("unix:"):
        return listen
    host = listen.rsplit(":", 1)[0]
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    return f"{host}:{port}"


def serve(
    address: str,
    servicers: PluginServicers,
    *,
    tls: ServerTLS | None = None,
    max_workers: int = 32,
    plugin_name: str = "plugin",
    registry: CollectorRegistry = REGISTRY,
    enforce_capabilities: bool = True,
) -> PluginServer:
    """Starts a plugin server on address (non-blocking) and returns it.

    Registers the given services, grpc.health.v1 (SERVING for "" and each service), server
    reflection, and the interceptor that maps PluginError to status codes, logs every RPC as
    a JSON line and records fleet_plugin_rpc_total / fleet_plugin_rpc_duration_seconds in
    registry (created once per registry, so serve() may run many times in one process).

    With enforce_capabilities (the default) the identity servicer is asked for its
    capabilities once, and every RPC outside them answers UNIMPLEMENTED before reaching a
    servicer, as the contract requires; servicers need not check capabilities themselves.
    """
    refused = _refusals(servicers.identity) if enforce_capabilities else {}
    interceptor = RpcInterceptor(plugin_name, rpc_metrics(registry), refused)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=plugin_name),
        interceptors=[interceptor],
        options=[("grpc.so_reuseport", 0)],
    )
    names = [IDENTITY_SERVICE]
    identity_pb2_grpc.add_IdentityServiceServicer_to_server(servicers.identity, server)
    if servicers.cluster is not None:
        if isinstance(servicers.cluster, ClusterServicer):
            # StartOperations refuses an item of a refused RPC as that RPC itself, and logs
            # and counts each item as its RPC.
            prefix = f"/{CLUSTER_SERVICE}/"
            servicers.cluster.serve_items(
                {m[len(prefix) :]: why for m, why in refused.items() if m.startswith(prefix)},
                interceptor.record_item,
            )
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(servicers.cluster, server)
        names.append(CLUSTER_SERVICE)
    if servicers.health is not None:
        health_pb2_grpc.add_HealthServiceServicer_to_server(servicers.health, server)
        names.append(HEALTH_SERVICE)
    if servicers.gate is not None:
        gate_pb2_grpc.add_GateServiceServicer_to_server(servicers.gate, server)
        names.append(GATE_SERVICE)

    health_servicer = std_health.HealthServicer()
    std_health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *names]:
        health_servicer.set(name, std_health_pb2.HealthCheckResponse.SERVING)
    health_name = std_health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    reflection.enable_server_reflection([*names, health_name, reflection.SERVICE_NAME], server)

    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.credentials())
    except RuntimeError as exc:
        raise OSError(f"listen: cannot bind {address!r}; pick a free HOST:PORT") from exc
    if port == 0 and not address.startswith("unix:"):
        raise OSError(f"listen: cannot bind {address!r}; pick a free HOST:PORT")
    server.start()
    bound = _reachable_address(address, port)
    _LOG.info(
        "plugin server started",
        extra={
            "fields": {
                "plugin": plugin_name,
                "address": bound,
                "tls": "mtls" if tls and tls.client_ca_file else ("tls" if tls else "none"),
                "services": names,
            }
        },
    )
    return PluginServer(server, health_servicer, port, bound)


class _StartupContext:
    """Stands in for a ServicerContext when serve() asks the identity servicer at start."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def is_active(self) -> bool:
        return True

    def time_remaining(self) -> None:
        return None

    def add_callback(self, _callback: Callable[[], None]) -> bool:
        return False

    def peer(self) -> str:
        return "local:startup"

    def set_code(self, _code: grpc.StatusCode) -> None:
        return None

    def set_details(self, _details: str) -> None:
        return None

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code.name}: {details}")


def _refusals(identity: identity_pb2_grpc.IdentityServiceServicer) -> dict[str, str]:
    """Full method name -> UNIMPLEMENTED message for every RPC outside the capabilities."""
    context: Any = _StartupContext()
    try:
        response = identity.GetPluginCapabilities(
            identity_pb2.GetPluginCapabilitiesRequest(), context
        )
        if not isinstance(response, identity_pb2.GetPluginCapabilitiesResponse):
            raise TypeError("GetPluginCapabilities must answer synchronously")
        declared = frozenset(response.capabilities)
    except Exception:
        _LOG.exception("cannot read the capabilities at start; servicers must refuse RPCs")
        return {}
    refused: dict[str, str] = {}
    for module, name in (
        (cluster_pb2, "ClusterService"),
        (health_pb2, "HealthService"),
        (gate_pb2, "GateService"),
    ):
        service = module.DESCRIPTOR.services_by_name[name]
        for method in service.methods:
            if method.name in RPC_CAPABILITIES and not supports(declared, method.name):
                refused[f"/{service.full_name}/{method.name}"] = (
                    f"{method.name} is outside this plugin's declared capabilities"
                )
    return refused


def run_until_signal(server: PluginServer, grace: float = 10.0) -> None:
    """Blocks until SIGTERM or SIGINT, then reports NOT_SERVING and stops within grace seconds.

    Must run in the main thread (Python delivers signals there).
    """
    received = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        received.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in signals}
    try:
        while not received.wait(0.5):
            if server.stopped:
                return
        _LOG.info("shutting down", extra={"fields": {"grace_seconds": grace}})
        server.stop(grace)
        _LOG.info("stopped")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """Adds the flags every plugin shares: listen address, TLS files, metrics, debug."""
    parser.add_argument(
        "--listen",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="address to serve gRPC on (default %(default)s; port 0 picks a free port)",
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="server certificate chain (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    parser.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="CA bundle (PEM) that client certificates must chain to; enables mTLS",
    )
    parser.add_argument(
        "--metrics-addr",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over HTTP here (default: off)",
    )
    parser.add_argument("--debug", action="store_true", help="log every RPC (DEBUG level)")


class ServedFleet(Protocol):
    """What a plugin serves over its fleet: started once, closed once, with an operation
    store (closed first, so no RPC records into a closed journal)."""

    @property
    def store(self) -> Any: ...

    def start(self) -> None: ...

    def close(self) -> None: ...


F = TypeVar("F", bound=ServedFleet)


@dataclass(kw_only=True)
class ServeOptions:
    """How a plugin process serves: its address, TLS, metrics registry (None: the default
    one) and gRPC worker threads. A plugin's options extend it with its configuration."""

    listen: str = "127.0.0.1:0"
    tls: ServerTLS | None = None
    registry: CollectorRegistry | None = None
    max_workers: int = 32


class ServeArgs(TypedDict):
    """ServeOptions' fields as the command line gives them (serve_args)."""

    listen: str
    tls: ServerTLS | None
    registry: CollectorRegistry


def serve_args(args: argparse.Namespace) -> ServeArgs:
    """The ServeOptions fields of a plugin command (add_server_args' flags; the default
    registry, which --metrics-addr serves): `XPluginOptions(config=..., **serve_args(args))`."""
    return ServeArgs(listen=args.listen, tls=server_tls_from_args(args), registry=REGISTRY)


class FleetServer(Generic[F]):
    """A plugin process's fleet and its gRPC server as one unit: the fleet starts, then the
    server serves its servicers; if either fails the fleet is closed; stop() closes the
    store, stops the server (in-flight RPCs get grace seconds), then closes the fleet."""

    def __init__(
        self,
        fleet: F,
        servicers: Callable[[], PluginServicers],
        options: ServeOptions,
        *,
        plugin_name: str,
    ) -> None:
        self.fleet = fleet
        try:
            fleet.start()
            self.server: PluginServer = serve(
                options.listen,
                servicers(),
                tls=options.tls,
                max_workers=options.max_workers,
                plugin_name=plugin_name,
                registry=options.registry if options.registry is not None else REGISTRY,
            )
        except BaseException:
            fleet.close()
            raise
        self.server.add_stop_callback(fleet.store.close)

    @property
    def address(self) -> str:
        """HOST:PORT the gRPC server listens on."""
        return self.server.address

    def stop(self, grace: float = 1.0) -> None:
        """Stops the store, the server, then the fleet."""
        self.fleet.store.close()
        if not self.server.stopped:
            self.server.stop(grace)
        self.fleet.close()


def server_tls_from_args(args: argparse.Namespace) -> ServerTLS | None:
    """Builds ServerTLS from the flags of add_server_args; None when TLS is not asked for."""
    cert = getattr(args, "tls_cert", None)
    key = getattr(args, "tls_key", None)
    client_ca = getattr(args, "tls_client_ca", None)
    if not cert and not key:
        if client_ca:
            raise ValueError("--tls-client-ca: needs --tls-cert and --tls-key as well")
        return None
    if not cert:
        raise ValueError("--tls-cert: required with --tls-key; pass the server certificate")
    if not key:
        raise ValueError("--tls-key: required with --tls-cert; pass the server private key")
    return ServerTLS(cert_file=cert, key_file=key, client_ca_file=client_ca or None)


def configure_logging(debug: bool = False) -> None:
    """Sends every log record to stderr as one JSON line; DEBUG also logs successful RPCs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)


def start_metrics_server(address: str, registry: CollectorRegistry = REGISTRY) -> None:
    """Serves registry over HTTP at HOST:PORT (":PORT" means all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--metrics-addr: {address!r} is not HOST:PORT; use e.g. ':9090'")
    start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
