"""The fleet-plugin-gke command: GKE clusters served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from google.auth.credentials import Credentials
from prometheus_client import REGISTRY, CollectorRegistry

from plugins.gke.api import GkeApi
from plugins.gke.config import GkeConfig, gke_fleet_id, load_config
from plugins.gke.fleet import GkeFleet
from plugins.gke.servicers import gke_servicers
from plugins.sdk import (
    FleetServer,
    ServerTLS,
    package_version,
    parse_plugin_args,
    plugin_parser,
    run_plugin,
    server_tls_from_args,
)

__all__ = ["GkePlugin", "GkePluginOptions", "build_parser", "main"]

_LOG = logging.getLogger("plugins.gke.server")
# Google's libraries log HTTP requests and token exchanges at DEBUG; --debug must not print
# them (a token response is a secret), so these stay at INFO whatever the root level is.
_QUIET_LOGGERS = ("google", "google_auth_httplib2", "urllib3", "requests")


@dataclass
class GkePluginOptions:
    """What a GkePlugin runs: its configuration, address, TLS and metrics registry."""

    config: GkeConfig
    listen: str = "127.0.0.1:0"
    tls: ServerTLS | None = None
    registry: CollectorRegistry | None = None
    credentials: Credentials | None = None  # None: from config.api (ADC or anonymous)
    max_workers: int = 32


class GkePlugin(FleetServer[GkeFleet]):
    """A running GKE plugin: the fleet (GKE + compute clients, poller) and its gRPC server."""

    def __init__(self, options: GkePluginOptions) -> None:
        self.options = options
        config = options.config
        fleet = GkeFleet(config, GkeApi(config.api, options.credentials))
        manifest = {
            "clusters": str(len(config.clusters.ids)),
            "discovery": str(len(config.clusters.discover)),
            "traffic": config.traffic.mode,
            "endpoint": config.api.container_endpoint or "container.googleapis.com",
        }
        super().__init__(
            fleet,
            lambda: gke_servicers(
                fleet, package_version(), manifest, fleet_id=gke_fleet_id(config)
            ),
            listen=options.listen,
            tls=options.tls,
            max_workers=options.max_workers,
            plugin_name="gke",
            registry=options.registry,
        )


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-gke."""
    return plugin_parser(
        "fleet-plugin-gke", "Serve GKE clusters over the fleetupgrade plugin contract.", config=True
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the plugin until SIGTERM/SIGINT."""
    args = parse_plugin_args(build_parser(), argv)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)

    def options() -> GkePluginOptions:
        return GkePluginOptions(
            config=load_config(args.config),
            listen=args.listen,
            tls=server_tls_from_args(args),
            registry=REGISTRY,
        )

    def ready(plugin: GkePlugin) -> None:
        fields = {"address": plugin.address, "config": str(Path(args.config))}
        _LOG.info("GKE plugin ready", extra={"fields": fields})

    return run_plugin("fleet-plugin-gke", args, options, GkePlugin, ready)


if __name__ == "__main__":
    sys.exit(main())
