"""The fleet-plugin-ocm command: an Open Cluster Management hub served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry

from plugins.ocm.config import ConfigError, OcmConfig, load_config
from plugins.ocm.hub import connect
from plugins.ocm.hubs import OcmHubs
from plugins.ocm.servicers import ocm_servicers
from plugins.sdk import (
    Kube,
    PluginServer,
    ServerTLS,
    package_version,
    parse_plugin_args,
    plugin_parser,
    run_plugin,
    serve,
    server_tls_from_args,
)

__all__ = ["OcmOptions", "OcmPlugin", "build_parser", "main"]

_LOG = logging.getLogger("plugins.ocm.server")
_SYNC_WAIT = 10.0  # seconds to wait for the first hub list before serving (Probe says why)


@dataclass
class OcmOptions:
    """What an OcmPlugin runs: the hub kubeconfig (or the configuration's hubs), the
    configuration and the server settings."""

    config: OcmConfig
    kubeconfig: str | None = None
    listen: str = "127.0.0.1:0"
    tls: ServerTLS | None = None
    registry: CollectorRegistry | None = None
    sync_wait: float = _SYNC_WAIT


def _connect_all(options: OcmOptions) -> dict[str, Kube]:
    """The hub clients by name: the configuration's hubs, or the one --kubeconfig names."""
    hubs = options.config.hubs
    if hubs and options.kubeconfig:
        raise ConfigError(
            "--kubeconfig and the configuration's hubs both name hubs; give the hubs in one "
            "place (a single hub: --kubeconfig, several: hubs[])"
        )
    if not hubs:
        return {"hub": connect(options.kubeconfig)}
    connected: dict[str, Kube] = {}
    try:
        for index, hub in enumerate(hubs):
            connected[hub.name] = connect(
                hub.kubeconfig, hub.name if len(hubs) > 1 else "", f"hubs[{index}].kubeconfig"
            )
    except BaseException:
        for kube in connected.values():
            kube.close()
        raise
    return connected


class OcmPlugin:
    """A running plugin: the hubs' caches, the operation followers and the gRPC server."""

    def __init__(self, options: OcmOptions) -> None:
        self.options = options
        kubes = _connect_all(options)
        self.fleet = OcmHubs(options.config, kubes)
        self.fleet.start()
        try:
            if not self.fleet.wait_synced(options.sync_wait):
                _, why = self.fleet.readiness()
                _LOG.warning("serving before the hub is listed", extra={"fields": {"why": why}})
            manifest: dict[str, str] = {"upgradeMethod": options.config.upgrade_method}
            if len(kubes) == 1:
                manifest["hub"] = next(iter(kubes.values())).server
            else:
                manifest["hubs"] = ",".join(f"{n}={k.server}" for n, k in kubes.items())
            # The hubs are the fleet: the same hubs reached by two plugin addresses are one
            # provider.
            hubs_id = ",".join(sorted(k.server for k in kubes.values()))
            servicers = ocm_servicers(self.fleet, package_version(), manifest, fleet_id=hubs_id)
            self.server: PluginServer = serve(
                options.listen,
                servicers,
                tls=options.tls,
                plugin_name="ocm",
                registry=options.registry if options.registry is not None else REGISTRY,
            )
        except BaseException:
            self.fleet.close()
            raise
        self.server.add_stop_callback(self.fleet.close_streams)

    @property
    def address(self) -> str:
        """HOST:PORT the gRPC server listens on."""
        return self.server.address

    def stop(self, grace: float = 1.0) -> None:
        """Stops the server (in-flight RPCs get grace seconds), then the caches and threads."""
        self.fleet.close_streams()
        if not self.server.stopped:
            self.server.stop(grace)
        self.fleet.close()


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-ocm."""
    parser = plugin_parser(
        "fleet-plugin-ocm",
        "Serve an Open Cluster Management hub over the fleetupgrade plugin contract.",
        config=True,
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig of the OCM hub (default: in-cluster config, then ~/.kube/config); "
        "for several hubs list them under hubs in the configuration instead",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the plugin until SIGTERM/SIGINT."""
    args = parse_plugin_args(build_parser(), argv)

    def options() -> OcmOptions:
        return OcmOptions(
            config=load_config(args.config),
            kubeconfig=args.kubeconfig,
            listen=args.listen,
            tls=server_tls_from_args(args),
            registry=REGISTRY,
        )

    def ready(plugin: OcmPlugin) -> None:
        fields = {
            "address": plugin.address,
            "upgradeMethod": plugin.options.config.upgrade_method,
            "hub": plugin.fleet.readiness()[1] or "listed",
        }
        _LOG.info("OCM plugin ready", extra={"fields": fields})

    return run_plugin("fleet-plugin-ocm", args, options, OcmPlugin, ready)


if __name__ == "__main__":
    sys.exit(main())
