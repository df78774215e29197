"""The fleet-plugin-aks command: AKS managed clusters served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from azure.core.credentials import TokenCredential

from plugins.aks.api import AksApi, build_credential
from plugins.aks.config import AksConfig, aks_fleet_id, load_config
from plugins.aks.fleet import AksFleet
from plugins.aks.servicers import aks_servicers
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

__all__ = ["AksPlugin", "AksPluginOptions", "build_parser", "main"]

_LOG = logging.getLogger("plugins.aks.server")
# azure-core logs requests (headers included) and azure-identity token exchanges at DEBUG;
# --debug must not print them, so these stay at WARNING whatever the root level is.
_QUIET_LOGGERS = ("azure", "msal", "urllib3")


@dataclass
class AksPluginOptions(ServeOptions):
    """What an AksPlugin runs: its configuration and credential (and how it serves:
    ServeOptions)."""

    config: AksConfig
    credential: TokenCredential | None = None  # None: from config.api.credentials


class AksPlugin(FleetServer[AksFleet]):
    """A running AKS plugin: the fleet (ARM clients, operation follower) and its gRPC server."""

    def __init__(self, options: AksPluginOptions) -> None:
        self.options = options
        config = options.config
        credential = options.credential or build_credential(config.api)
        fleet = AksFleet(config, AksApi(config.api, credential, config.operations.poll_seconds))
        manifest = {
            "clusters": str(len(config.clusters.ids)),
            "discovery": str(len(config.clusters.discover)),
            "traffic": config.traffic.mode,
            "endpoint": config.api.endpoint,
        }
        super().__init__(
            fleet,
            lambda: aks_servicers(fleet, package_version(), manifest, aks_fleet_id(config)),
            options,
            plugin_name="aks",
        )


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-aks."""
    return plugin_parser(
        "fleet-plugin-aks",
        "Serve AKS managed clusters over the fleetupgrade plugin contract.",
        config=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the plugin until SIGTERM/SIGINT."""
    args = parse_plugin_args(build_parser(), argv)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)

    def options() -> AksPluginOptions:
        return AksPluginOptions(config=load_config(args.config), **serve_args(args))

    ready = announce_ready(_LOG, "AKS plugin", args)
    return run_plugin("fleet-plugin-aks", args, options, AksPlugin, ready)


if __name__ == "__main__":
    sys.exit(main())
