"""The fleet-plugin-sim command: a simulated fleet served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from prometheus_client import REGISTRY, CollectorRegistry

from plugins.sdk import (
    PluginServer,
    ServerTLS,
    package_version,
    parse_plugin_args,
    parse_version,
    plugin_parser,
    run_plugin,
    serve,
    server_tls_from_args,
)
from plugins.sim.admin import AdminServer
from plugins.sim.config import ConfigError, FleetConfig, GenerateSpec, load_fleet_file
from plugins.sim.fleet import Fleet
from plugins.sim.monitor import InvariantMonitor, MonitorCollector, MonitorFileWriter
from plugins.sim.servicers import sim_servicers

__all__ = ["SimOptions", "Simulator", "build_parser", "main"]

_LOG = logging.getLogger("plugins.sim.server")


@dataclass
class SimOptions:
    """What a Simulator runs: the fleet (file, generated count or config) and its extras."""

    fleet_file: str | None = None
    generate: int | None = None
    config: FleetConfig | None = None
    listen: str = "127.0.0.1:0"
    tls: ServerTLS | None = None
    monitor_file: str | None = None
    step_seconds: float | None = None
    seed: int | None = None
    target_version: str | None = None
    admin_addr: str | None = None
    mutator_window_seconds: float = 5.0
    reload_interval: float = 1.0  # seconds between mtime checks of fleet_file; 0: on request only
    registry: CollectorRegistry | None = None  # where to export fleet_sim_* gauges
    max_workers: int = 32
    state_dir: str | None = None  # journal operations here (DURABLE_OPERATIONS); None: memory


STATE_FILE = "operations.jsonl"
"""The operation journal's name inside --state-dir."""


class Simulator:
    """A running sim: the fleet, its gRPC server, monitor file, admin endpoint, file watcher."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        config = self._load()
        self.monitor = InvariantMonitor(
            options.target_version, window_seconds=options.mutator_window_seconds
        )
        state_path = Path(options.state_dir) / STATE_FILE if options.state_dir else None
        try:
            self.fleet = Fleet(
                config,
                monitor=self.monitor,
                step_seconds=options.step_seconds,
                seed=options.seed,
                state_path=state_path,
            )
        except OSError as exc:
            raise ConfigError(
                f"--state-dir: cannot use {options.state_dir!r} ({exc.strerror}); pass a "
                "writable directory"
            ) from None
        except ValueError as exc:
            raise ConfigError(f"--state-dir: {exc}") from None
        self._writer: MonitorFileWriter | None = None
        self._collector: MonitorCollector | None = None
        self.admin: AdminServer | None = None
        self._stop = threading.Event()
        self._reload_now = threading.Event()
        self._watcher: threading.Thread | None = None
        self._reload_lock = threading.Lock()
        try:
            if options.monitor_file:
                self._writer = MonitorFileWriter(self.monitor, options.monitor_file)
            if options.registry is not None:
                self._collector = MonitorCollector(self.monitor)
                options.registry.register(self._collector)
            source = options.fleet_file or f"generated:{self.fleet.cluster_count}"
            manifest = {"fleet": source, "clusters": str(self.fleet.cluster_count)}
            if state_path is not None:
                manifest["state"] = str(state_path)
            servicers = sim_servicers(
                self.fleet, package_version(), manifest, fleet_id(options.state_dir)
            )
            self.server: PluginServer = serve(
                options.listen,
                servicers,
                tls=options.tls,
                max_workers=options.max_workers,
                plugin_name="sim",
                registry=options.registry if options.registry is not None else REGISTRY,
            )
            if options.admin_addr:
                reload = self.reload if options.fleet_file else None
                self.admin = AdminServer(options.admin_addr, self.fleet, self.monitor, reload)
                _LOG.info(
                    "admin endpoint started", extra={"fields": {"address": self.admin.address}}
                )
        except BaseException:
            self._close_parts()
            raise
        if options.fleet_file:
            self._watcher = threading.Thread(
                target=self._watch_file, name="sim-fleet-file", daemon=True
            )
            self._watcher.start()

    @property
    def address(self) -> str:
        """HOST:PORT the gRPC server listens on."""
        return self.server.address

    def _load(self) -> FleetConfig:
        options = self.options
        sources = [options.fleet_file, options.generate, options.config]
        if sum(s is not None for s in sources) != 1:
            raise ConfigError("pass exactly one of --fleet FILE or --generate N")
        if options.target_version:
            try:
                parse_version(options.target_version)
            except ValueError:
                raise ConfigError(
                    f"--target-version: {options.target_version!r} is not a version; "
                    "write it like 1.29.4"
                ) from None
        if options.config is not None:
            return options.config
        if options.generate is not None:
            if options.generate < 1:
                raise ConfigError("--generate: must be at least 1")
            return FleetConfig(generate=GenerateSpec(count=options.generate))
        assert options.fleet_file is not None
        return load_fleet_file(options.fleet_file)

    def reload(self) -> None:
        """Re-reads the fleet file and applies it (ConfigError leaves the fleet as it was)."""
        if not self.options.fleet_file:
            raise ConfigError("no --fleet file to reload")
        with self._reload_lock:
            config = load_fleet_file(self.options.fleet_file)
            self.fleet.apply_config(config)
        _LOG.info("fleet file reloaded", extra={"fields": {"path": self.options.fleet_file}})

    def request_reload(self) -> None:
        """Asks the file watcher to reload now (safe from a signal handler)."""
        self._reload_now.set()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.options.fleet_file or "")
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)

    def _watch_file(self) -> None:
        last = self._stamp()
        interval = self.options.reload_interval if self.options.reload_interval > 0 else None
        while not self._stop.is_set():
            forced = self._reload_now.wait(interval)
            if self._stop.is_set():
                return
            self._reload_now.clear()
            stamp = self._stamp()
            if not forced and (stamp is None or stamp == last):
                continue
            last = stamp
            try:
                self.reload()
            except ConfigError as exc:
                _LOG.error("fleet file not reloaded; keeping the fleet as it was: %s", exc)

    def _close_parts(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        if self._collector is not None and self.options.registry is not None:
            self.options.registry.unregister(self._collector)
            self._collector = None
        self.fleet.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def stop(self, grace: float = 1.0) -> None:
        """Stops the server (in-flight RPCs get grace seconds), timers, admin and watcher."""
        self._stop.set()
        self._reload_now.set()
        self.fleet.close()  # ends watch streams, so the server stops without waiting for them
        if not self.server.stopped:
            self.server.stop(grace)
        self._close_parts()
        if self._watcher is not None:
            self._watcher.join(timeout=5)


#: Where a sim with a state directory keeps its fleet id (GetPluginInfo fleet_id).
FLEET_ID_FILE = "fleet-id"


def fleet_id(state_dir: str | None) -> str:
    """What this sim acts on: the fleet kept in its state directory (its id is kept there too,
    so a restarted sim is the same provider), else this process's own fleet, which lives and
    dies with the process."""
    if not state_dir:
        return f"process-{uuid.uuid4().hex}"
    path = Path(state_dir) / FLEET_ID_FILE
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    found = f"state-{uuid.uuid4().hex}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(found + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return found


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-sim."""
    parser = plugin_parser(
        "fleet-plugin-sim",
        "Serve a simulated fleet of clusters over the fleetupgrade plugin contract.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--fleet", metavar="FILE", help="fleet file (YAML); reloaded on change")
    source.add_argument(
        "--generate", type=int, metavar="N", help="generate N clusters cluster-00001.."
    )
    parser.add_argument(
        "--monitor-file", metavar="PATH", help="write the invariant monitor here as JSON"
    )
    parser.add_argument(
        "--step-seconds",
        type=float,
        metavar="S",
        help="default duration of every step (overrides the file's defaults.stepSeconds)",
    )
    parser.add_argument("--seed", type=int, help="random seed (jitter, faults)")
    parser.add_argument(
        "--target-version", metavar="V", help="count clusters at this version in the monitor"
    )
    parser.add_argument(
        "--admin-addr", metavar="HOST:PORT", help="serve the HTTP admin endpoint here"
    )
    parser.add_argument(
        "--mutator-window-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="mutating calls of two callers within S seconds count as concurrent (default 5)",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"journal operations in DIR/{STATE_FILE} so they survive a restart (declares "
        "PLUGIN_CAPABILITY_DURABLE_OPERATIONS); default: in memory only",
    )
    parser.add_argument(
        "--reload-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="check the fleet file for changes every S seconds (0: only on SIGHUP)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the sim until SIGTERM/SIGINT; SIGHUP reloads the fleet file."""
    parser = build_parser()
    args = parse_plugin_args(parser, argv)
    if args.step_seconds is not None and args.step_seconds < 0:
        parser.error("--step-seconds: must be 0 or more")

    def options() -> SimOptions:
        return SimOptions(
            fleet_file=args.fleet,
            generate=args.generate,
            listen=args.listen,
            tls=server_tls_from_args(args),
            monitor_file=args.monitor_file,
            step_seconds=args.step_seconds,
            seed=args.seed,
            target_version=args.target_version,
            admin_addr=args.admin_addr,
            mutator_window_seconds=args.mutator_window_seconds,
            reload_interval=args.reload_interval,
            registry=REGISTRY,
            state_dir=args.state_dir,
        )

    def ready(sim: Simulator) -> None:
        def _on_hup(signum: int, frame: FrameType | None) -> None:
            sim.request_reload()

        if args.fleet and hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, _on_hup)
        _LOG.info(
            "simulated fleet ready",
            extra={
                "fields": {
                    "address": sim.address,
                    "clusters": sim.fleet.cluster_count,
                    "fleet": str(Path(args.fleet)) if args.fleet else f"generated:{args.generate}",
                }
            },
        )

    return run_plugin("fleet-plugin-sim", args, options, Simulator, ready)


if __name__ == "__main__":
    sys.exit(main())
