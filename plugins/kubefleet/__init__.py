"""KubeFleet plugin: approval requests as gates, workload health, inventory, metric collector."""

from plugins.kubefleet.collector import CollectorOptions, MetricCollectorAgent
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.fleet import HEALTH_CONDITION, KubeFleetHub, collector_names
from plugins.kubefleet.server import KubeFleetOptions, KubeFleetPlugin, main
from plugins.kubefleet.servicers import CAPABILITIES, PLUGIN_NAME

__all__ = [
    "CAPABILITIES",
    "HEALTH_CONDITION",
    "PLUGIN_NAME",
    "CollectorOptions",
    "KubeFleetConfig",
    "KubeFleetHub",
    "KubeFleetOptions",
    "KubeFleetPlugin",
    "MetricCollectorAgent",
    "collector_names",
    "main",
]
