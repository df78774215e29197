"""The fleet-plugin-legacy command: our plugin contract served on top of a plugin server written
for the original multicluster-upgrade-operator (package `plugin`, service `Cluster`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.legacy.backend import LegacyBackend
from plugins.legacy.inventory import Inventory, load_clusters_file
from plugins.legacy.operations import BridgeOperations, Operations, Poller
from plugins.legacy.state import SUFFIX, SentState
from plugins.legacy.upstream import Upstream, UpstreamError
from plugins.sdk import (
    ClientTLS,
    ClusterServicer,
    PluginServer,
    PluginServicers,
    ServerTLS,
    StaticIdentity,
    package_version,
    parse_plugin_args,
    plugin_parser,
    run_plugin,
    serve,
    server_tls_from_args,
)

__all__ = ["PLUGIN_NAME", "BridgeOptions", "LegacyBridge", "build_parser", "main"]

_LOG = logging.getLogger("plugins.legacy.server")
_Cap = identity_pb2.PluginCapability

PLUGIN_NAME = "legacy.fleetupgrade.io"
"""The bridge's name in GetPluginInfo."""


@dataclass
class BridgeOptions:
    """What a LegacyBridge runs: the upstream, the clusters, the state file, the server."""

    upstream: str
    clusters: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # id → labels
    state_file: str | None = None
    upstream_tls: ClientTLS | None = None  # None: plaintext (the original's insecure: true)
    upstream_timeout: float = 8.0  # seconds per upstream call (within our 10 s deadlines)
    poll_interval: float = 2.0
    unknown_grace: float = 60.0
    listen: str = "127.0.0.1:0"
    tls: ServerTLS | None = None
    registry: CollectorRegistry | None = None
    max_workers: int = 32


class LegacyBridge:
    """A running bridge: upstream channel, state, operations, poller and gRPC server."""

    def __init__(self, options: BridgeOptions) -> None:
        self.options = options
        self.poller: Poller | None = None
        self._closers: list[Callable[[], None]] = []
        registry = options.registry if options.registry is not None else REGISTRY
        self.upstream = Upstream(
            options.upstream,
            options.upstream_tls,
            timeout=options.upstream_timeout,
            registry=registry,
        )
        self._closers.append(self.upstream.close)
        try:
            state_file = options.state_file
            sent = SentState(state_file + SUFFIX if state_file else None, options.upstream)
            self.store = BridgeOperations("legacy", state_path=state_file)
            self._closers.append(self.store.close)
            self.inventory = Inventory(options.clusters, self.upstream, self.store.in_flight)
            self._closers.append(self.inventory.close)
            self.operations = Operations(
                self.inventory, sent, self.store, unknown_grace=options.unknown_grace
            )
            capabilities = [
                _Cap.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
                _Cap.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
                _Cap.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
                _Cap.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
            ]
            if self.store.durable:
                capabilities.append(_Cap.PLUGIN_CAPABILITY_DURABLE_OPERATIONS)
            identity = StaticIdentity(
                PLUGIN_NAME,
                package_version(),
                capabilities,
                probe=self.probe,
                # The upstream operator's endpoint is what this bridge acts on.
                fleet_id=options.upstream,
                manifest={
                    "upstream": options.upstream,
                    "clusters": str(len(self.inventory.ids)),
                    "durable": str(self.store.durable).lower(),
                },
            )
            servicers = PluginServicers(
                identity=identity,
                cluster=ClusterServicer(LegacyBackend(self.inventory, self.operations)),
            )
            self.poller = Poller(self.operations, options.poll_interval)
            self.server: PluginServer = serve(
                options.listen,
                servicers,
                tls=options.tls,
                max_workers=options.max_workers,
                plugin_name="legacy",
                registry=registry,
            )
        except BaseException:
            self._close_parts()
            raise
        self.server.add_stop_callback(self.store.close)

    @property
    def address(self) -> str:
        """HOST:PORT the bridge serves on."""
        return self.server.address

    def probe(self) -> tuple[bool, str]:
        """Ready when the upstream answers HealthCheck."""
        try:
            self.upstream.health_check()
        except UpstreamError as exc:
            return False, f"the upstream plugin at {exc.endpoint} does not answer: {exc.code.name}"
        return True, ""

    def _close_parts(self) -> None:
        if self.poller is not None:
            self.poller.stop()
            self.poller = None
        while self._closers:
            self._closers.pop()()

    def stop(self, grace: float = 1.0) -> None:
        """Stops serving (in-flight RPCs get grace seconds), polling and the upstream channel."""
        if self.poller is not None:  # first: nothing changes after the journal closes
            self.poller.stop()
            self.poller = None
        self.store.close()  # ends watch streams, so the server stops without waiting for them
        if not self.server.stopped:
            self.server.stop(grace)
        self._close_parts()


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-legacy."""
    parser = plugin_parser(
        "fleet-plugin-legacy",
        "Serve the fleetupgrade plugin contract on top of a plugin server written for the "
        "original multicluster-upgrade-operator (package plugin, service Cluster).",
    )
    parser.add_argument(
        "--upstream", required=True, metavar="HOST:PORT", help="the original plugin server"
    )
    parser.add_argument(
        "--upstream-insecure",
        action="store_true",
        help="plaintext to the upstream (the original's opsEndpoint.insecure: true); "
        "default is TLS",
    )
    parser.add_argument("--upstream-ca", metavar="FILE", help="CA bundle (PEM) for the upstream")
    parser.add_argument("--upstream-cert", metavar="FILE", help="client certificate (PEM), mTLS")
    parser.add_argument("--upstream-key", metavar="FILE", help="client private key (PEM), mTLS")
    parser.add_argument(
        "--upstream-server-name", metavar="NAME", help="name expected in the upstream's cert"
    )
    parser.add_argument(
        "--upstream-timeout",
        type=float,
        default=8.0,
        metavar="S",
        help="deadline of each upstream call in seconds (default %(default)s)",
    )
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="ID",
        help="a cluster id the upstream serves (repeatable)",
    )
    parser.add_argument(
        "--clusters-file",
        metavar="FILE",
        help="YAML: a list of ids (or {id, labels}), or the original ClusterVersion manifest",
    )
    parser.add_argument(
        "--state",
        metavar="FILE",
        help="keep request ids and operations here (atomic rewrites); enables "
        "DURABLE_OPERATIONS. Without it they are kept in memory only",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="ask the upstream about operations in flight every S seconds (default %(default)s)",
    )
    parser.add_argument(
        "--unknown-grace",
        type=float,
        default=60.0,
        metavar="S",
        help="an operation the upstream answers UNKNOWN for this long (and whose cluster is "
        "not as asked) fails (default %(default)s)",
    )
    return parser


def upstream_tls_from_args(args: argparse.Namespace) -> ClientTLS | None:
    """ClientTLS from the --upstream-* flags; None with --upstream-insecure."""
    files = (args.upstream_ca, args.upstream_cert, args.upstream_key, args.upstream_server_name)
    if args.upstream_insecure:
        if any(files):
            raise ValueError(
                "--upstream-insecure: plaintext cannot use --upstream-ca/-cert/-key/-server-name;"
                " drop one or the other"
            )
        return None
    if (args.upstream_cert is None) != (args.upstream_key is None):
        raise ValueError("--upstream-cert: goes with --upstream-key; pass both or neither")
    return ClientTLS(
        ca_file=args.upstream_ca,
        cert_file=args.upstream_cert,
        key_file=args.upstream_key,
        server_name=args.upstream_server_name,
    )


def clusters_from_args(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Cluster id → labels from --clusters-file, then --cluster (without labels)."""
    clusters = load_clusters_file(args.clusters_file) if args.clusters_file else {}
    for index, cluster_id in enumerate(args.cluster):
        if not cluster_id:
            raise ValueError(f"--cluster: occurrence {index + 1} is empty; pass a cluster id")
        clusters.setdefault(cluster_id, {})
    return clusters


def main(argv: list[str] | None = None) -> int:
    """Runs the bridge until SIGTERM/SIGINT."""
    parser = build_parser()
    args = parse_plugin_args(parser, argv)
    for flag in ("upstream_timeout", "poll_interval", "unknown_grace"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')}: must be positive seconds")

    def options() -> BridgeOptions:
        return BridgeOptions(
            upstream=args.upstream,
            clusters=clusters_from_args(args),
            state_file=args.state,
            upstream_tls=upstream_tls_from_args(args),
            upstream_timeout=args.upstream_timeout,
            poll_interval=args.poll_interval,
            unknown_grace=args.unknown_grace,
            listen=args.listen,
            tls=server_tls_from_args(args),
            registry=REGISTRY,
        )

    def ready(bridge: LegacyBridge) -> None:
        _LOG.info(
            "legacy bridge ready",
            extra={
                "fields": {
                    "address": bridge.address,
                    "upstream": args.upstream,
                    "clusters": len(bridge.inventory.ids),
                    "durable": bool(args.state),
                }
            },
        )

    return run_plugin("fleet-plugin-legacy", args, options, LegacyBridge, ready)


if __name__ == "__main__":
    sys.exit(main())
