"""The fleet-plugin-kubefleet command: a KubeFleet hub served over the plugin contract."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry

from plugins.kubefleet.config import COOKBOOK_CHOICES, HEALTH_SOURCES, KubeFleetConfig
from plugins.kubefleet.fleet import KubeFleetHub, resolve_cookbook
from plugins.kubefleet.inventory import DEFAULT_TAINT_KEY, DEFAULT_VERSION_SOURCE, TaintSpec
from plugins.kubefleet.servicers import servicers
from plugins.sdk import (
    Kube,
    PluginServer,
    PluginServicers,
    ServerTLS,
    parse_plugin_args,
    plugin_parser,
    run_plugin,
    serve,
    server_tls_from_args,
)

__all__ = ["KubeFleetOptions", "KubeFleetPlugin", "build_parser", "main"]

_LOG = logging.getLogger("plugins.kubefleet.server")
_SYNC_WAIT = 10.0


@dataclass
class KubeFleetOptions:
    """What a KubeFleetPlugin runs: the hub kubeconfig, the configuration, the server settings."""

    config: KubeFleetConfig = field(default_factory=KubeFleetConfig)
    kubeconfig: str | None = None
    listen: str = "127.0.0.1:0"
    tls: ServerTLS | None = None
    registry: CollectorRegistry | None = None
    sync_wait: float = _SYNC_WAIT


class KubeFleetPlugin:
    """A running plugin: the hub caches, the reconcile thread and the gRPC server."""

    def __init__(self, options: KubeFleetOptions) -> None:
        problems = options.config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.options = options
        kube = Kube(options.kubeconfig, what="KubeFleet hub")
        try:
            cookbook = resolve_cookbook(kube, options.config.cookbook)
        except BaseException:
            kube.close()
            raise
        self.hub = KubeFleetHub(options.config, kube, cookbook)
        self.hub.start()
        try:
            if not self.hub.wait_synced(options.sync_wait):
                _, why = self.hub.readiness()
                _LOG.warning("serving before the hub is listed", extra={"fields": {"why": why}})
            manifest = {
                "hub": kube.server,
                "healthSource": options.config.health_source,
                "cookbook": f"{cookbook.name} ({cookbook.group})",
            }
            # The hub is the fleet: one hub reached by two plugin addresses is one provider.
            identity, cluster, health, gate = servicers(self.hub, manifest, fleet_id=kube.server)
            self.server: PluginServer = serve(
                options.listen,
                PluginServicers(identity=identity, cluster=cluster, health=health, gate=gate),
                tls=options.tls,
                plugin_name="kubefleet",
                registry=options.registry if options.registry is not None else REGISTRY,
            )
        except BaseException:
            self.hub.close()
            raise
        self.server.add_stop_callback(self.hub.close_streams)

    @property
    def address(self) -> str:
        """HOST:PORT the gRPC server listens on."""
        return self.server.address

    def stop(self, grace: float = 1.0) -> None:
        """Stops the server (in-flight RPCs get grace seconds), then the caches and threads."""
        self.hub.close_streams()
        if not self.server.stopped:
            self.server.stop(grace)
        self.hub.close()


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-plugin-kubefleet."""
    parser = plugin_parser(
        "fleet-plugin-kubefleet",
        "Serve a KubeFleet hub over the fleetupgrade plugin contract: approval requests as "
        "gates, workload health, MemberCluster inventory and taint service-out.",
    )
    defaults = KubeFleetConfig()
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig of the KubeFleet hub (default: in-cluster config, then ~/.kube/config)",
    )
    parser.add_argument(
        "--health-source",
        choices=HEALTH_SOURCES,
        default=defaults.health_source,
        help="reports: per-cluster MetricCollectorReports written by fleet-metric-collector "
        "(default); prometheus: one central Prometheus with every cluster's workload_health",
    )
    parser.add_argument(
        "--member-prometheus-url",
        default=defaults.member_prometheus_url,
        metavar="URL",
        help="the members' Prometheus, written into each MetricCollector (default %(default)s)",
    )
    parser.add_argument(
        "--collect-interval",
        default=defaults.collect_interval,
        metavar="DURATION",
        help="how often the agents collect, written into each MetricCollector (default 30s)",
    )
    parser.add_argument(
        "--report-max-age",
        type=float,
        default=defaults.report_max_age,
        metavar="SECONDS",
        help="older health data counts as UNKNOWN, never healthy (default %(default)s)",
    )
    parser.add_argument(
        "--central-prometheus-url",
        default="",
        metavar="URL",
        help="with --health-source prometheus: the Prometheus (or Thanos) holding every "
        "cluster's workload_health",
    )
    parser.add_argument(
        "--cluster-label",
        default=defaults.cluster_label,
        metavar="LABEL",
        help="the series label naming the member cluster in the central Prometheus",
    )
    parser.add_argument(
        "--evaluate-interval",
        type=float,
        default=defaults.evaluate_interval,
        metavar="SECONDS",
        help="how often the central Prometheus is asked per gate (default %(default)s)",
    )
    parser.add_argument(
        "--taint-key",
        default=DEFAULT_TAINT_KEY,
        metavar="KEY",
        help="the MemberCluster taint this plugin owns for service-out (default %(default)s)",
    )
    parser.add_argument(
        "--taint-value",
        default=TaintSpec().value,
        metavar="VALUE",
        help="the value of that taint; a taint with the key and another value is not ours",
    )
    parser.add_argument(
        "--version-source",
        default=DEFAULT_VERSION_SOURCE,
        metavar="SOURCE",
        help="where a member's Kubernetes version is read, first non-empty wins: auto "
        "(property:k8s.io/k8s-version, annotation:fleetupgrade.io/kubernetes-version, "
        "label:fleetupgrade.io/kubernetes-version) or a comma-separated list of property:NAME, "
        "annotation:KEY, label:KEY (default %(default)s)",
    )
    parser.add_argument(
        "--cookbook",
        choices=COOKBOOK_CHOICES,
        default=defaults.cookbook,
        help="the cookbook API generation: current (autoapprove.kubernetes-fleet.io, "
        "hub-created reports), seed (metric.kubernetes-fleet.io, placed MetricCollectors) or "
        "auto: whichever the hub serves, current first (default %(default)s)",
    )
    parser.add_argument(
        "--max-overrides",
        type=int,
        default=defaults.max_overrides,
        metavar="N",
        help="seed generation: ClusterResourceOverrides this plugin may use, each serving up to "
        "20 pending gates (KubeFleet admits 100 per hub; default %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.heartbeat_timeout,
        metavar="SECONDS",
        help="a member whose agent's last heartbeat (MemberCluster status.agentStatus "
        "lastReceivedHeartbeat) is older is not available; KubeFleet's scheduler uses 5 "
        "minutes (default %(default)s)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> KubeFleetConfig:
    """The KubeFleetConfig of parsed arguments."""
    return KubeFleetConfig(
        health_source=args.health_source,
        member_prometheus_url=args.member_prometheus_url,
        collect_interval=args.collect_interval,
        report_max_age=args.report_max_age,
        central_prometheus_url=args.central_prometheus_url,
        cluster_label=args.cluster_label,
        evaluate_interval=args.evaluate_interval,
        taint=TaintSpec(args.taint_key, args.taint_value),
        version_source=args.version_source,
        cookbook=args.cookbook,
        max_overrides=args.max_overrides,
        heartbeat_timeout=args.heartbeat_timeout,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the plugin until SIGTERM/SIGINT (exit 2 with one line naming a bad flag)."""
    args = parse_plugin_args(build_parser(), argv)

    def options() -> KubeFleetOptions:
        return KubeFleetOptions(
            config=config_from_args(args),
            kubeconfig=args.kubeconfig,
            listen=args.listen,
            tls=server_tls_from_args(args),
            registry=REGISTRY,
        )

    def ready(plugin: KubeFleetPlugin) -> None:
        _LOG.info(
            "KubeFleet plugin ready",
            extra={
                "fields": {
                    "address": plugin.address,
                    "healthSource": plugin.options.config.health_source,
                    "hub": plugin.hub.readiness()[1] or "listed",
                }
            },
        )

    return run_plugin("fleet-plugin-kubefleet", args, options, KubeFleetPlugin, ready)


if __name__ == "__main__":
    sys.exit(main())
