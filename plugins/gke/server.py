"""The fleet-plugin-gke command: GKE clusters served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from google.auth.credentials import Credentials

from plugins.gke.api import GkeApi
from plugins.gke.config import GkeConfig, gke_fleet_id, load_config
from plugins.gke.fleet import GkeFleet
from plugins.gke.servicers import gke_servicers
from plugins.sdk import (
    FleetServer,
    ServeOptions,
    announce_ready,
    package_version,
    parse_plugin_args,
    plugin_parser,
    run_plugin,
    serve_args,
)

__all__ = ["GkePlugin", "GkePluginOptions", "build_parser", "main"]

_LOG = logging.getLogger("plugins.gke.server")
# Google's libraries log HTTP requests and token exchanges at DEBUG; --debug must not print
# them (a token response is a secret), so these stay at INFO whatever the root level is.
_QUIET_LOGGERS = ("google", "google_auth_httplib2", "urllib3", "requests")


@dataclass
class GkePluginOptions(ServeOptions):
    """What a GkePlugin runs: its configuration (and how it serves: ServeOptions)."""

    config: GkeConfig
    credentials: Credentials | None = None  # None: from config.api (ADC or anonymous)


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
            options,
            plugin_name="gke",
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
        return GkePluginOptions(config=load_config(args.config), **serve_args(args))

    ready = announce_ready(_LOG, "GKE plugin", args)
    return run_plugin("fleet-plugin-gke", args, options, GkePlugin, ready)


if __name__ == "__main__":
    sys.exit(main())
