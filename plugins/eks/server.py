"""The fleet-plugin-eks command: EKS clusters served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from plugins.eks.api import EksApi
from plugins.eks.config import EksConfig, eks_fleet_id, load_config
from plugins.eks.fleet import EksFleet
from plugins.eks.servicers import eks_servicers
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

__all__ = ["EksPlugin", "EksPluginOptions", "build_parser", "main"]

_LOG = logging.getLogger("plugins.eks.server")
# botocore logs request headers (the SigV4 Authorization, a session token) and credential
# exchanges at DEBUG; --debug must not print them, so these stay at INFO whatever the root is.
_QUIET_LOGGERS = ("boto3", "botocore", "urllib3", "s3transfer")


@dataclass
class EksPluginOptions(ServeOptions):
    """What an EksPlugin runs: its configuration (and how it serves: ServeOptions)."""

    config: EksConfig


class EksPlugin(FleetServer[EksFleet]):
    """A running EKS plugin: the fleet (boto3 clients, update poller) and its gRPC server."""

    def __init__(self, options: EksPluginOptions) -> None:
        self.options = options
        config = options.config
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
        fleet = EksFleet(config, EksApi(config))
        manifest = {
            "account": config.account,
            "regions": ",".join(config.regions),
            "traffic": config.traffic.mode,
            "endpoint": config.api.endpoint or "eks.<region>.amazonaws.com",
        }
        super().__init__(
            fleet,
            lambda: eks_servicers(
                fleet, package_version(), manifest, fleet_id=eks_fleet_id(config)
            ),
            options,
            plugin_name="eks",
        )


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-eks."""
    return plugin_parser(
        "fleet-plugin-eks",
        "Serve Amazon EKS clusters over the fleetupgrade plugin contract.",
        config=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the plugin until SIGTERM/SIGINT."""
    args = parse_plugin_args(build_parser(), argv)

    def options() -> EksPluginOptions:
        return EksPluginOptions(config=load_config(args.config), **serve_args(args))

    ready = announce_ready(_LOG, "EKS plugin", args)
    return run_plugin("fleet-plugin-eks", args, options, EksPlugin, ready)


if __name__ == "__main__":
    sys.exit(main())
