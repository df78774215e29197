"""What every plugin command's main() does: shared flags, start, exit 2 on bad config, serve."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from plugins.sdk.server import (
    PluginServer,
    add_server_args,
    configure_logging,
    run_until_signal,
    start_metrics_server,
)

__all__ = [
    "CONFIG_EXIT",
    "SHUTDOWN_GRACE",
    "RunningPlugin",
    "announce_ready",
    "parse_plugin_args",
    "plugin_parser",
    "run_plugin",
]

SHUTDOWN_GRACE = 2.0
"""Seconds in-flight RPCs get on SIGTERM; open WatchOperations streams end after it."""

CONFIG_EXIT = 2
"""Exit code when the configuration, a flag or a file is wrong (the message says which)."""


class RunningPlugin(Protocol):
    """A started plugin: its gRPC server, and stop() that ends it and everything it runs."""

    @property
    def server(self) -> PluginServer: ...

    def stop(self, grace: float = ..., /) -> None: ...


OptionsT = TypeVar("OptionsT")
PluginT = TypeVar("PluginT", bound=RunningPlugin)


def plugin_parser(prog: str, description: str, config: bool = False) -> argparse.ArgumentParser:
    """A command line with the flags every plugin shares (listen, TLS, metrics, debug).

    config: also a required --config FILE (the plugin's YAML configuration).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_server_args(parser)
    if config:
        parser.add_argument(
            "--config", required=True, metavar="FILE", help="plugin configuration (YAML)"
        )
    return parser


def parse_plugin_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> argparse.Namespace:
    """Parses argv (exit 2 on bad flags) and sends logs to stderr as JSON (--debug: DEBUG too)."""
    args = parser.parse_args(argv)
    configure_logging(args.debug)
    return args


def run_plugin(
    prog: str,
    args: argparse.Namespace,
    options: Callable[[], OptionsT],
    start: Callable[[OptionsT], PluginT],
    ready: Callable[[PluginT], None],
    grace: float = SHUTDOWN_GRACE,
) -> int:
    """Builds options, starts the metrics server (--metrics-addr) and the plugin, serves.

    A ValueError (every plugin's ConfigError is one) or OSError while doing so is printed as
    "<prog>: <message>" and returns CONFIG_EXIT. Otherwise ready(plugin) runs (log "ready",
    install extra signal handlers), the plugin serves until SIGTERM/SIGINT, stops, and 0 is
    returned.
    """
    try:
        built = options()
        if args.metrics_addr:
            start_metrics_server(args.metrics_addr)
        plugin = start(built)
    except (ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return CONFIG_EXIT
    ready(plugin)
    run_until_signal(plugin.server, grace=grace)
    plugin.stop(0)
    return 0


class _Addressed(Protocol):
    @property
    def address(self) -> str: ...


def announce_ready(
    log: logging.Logger, what: str, args: argparse.Namespace
) -> Callable[[_Addressed], None]:
    """run_plugin's ready callback of a plugin with --config: logs "<what> ready" with the
    address it serves and its configuration file."""

    def ready(plugin: _Addressed) -> None:
        fields = {"address": plugin.address, "config": str(Path(args.config))}
        log.info(f"{what} ready", extra={"fields": fields})

    return ready
