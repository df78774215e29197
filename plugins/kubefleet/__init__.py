"""KubeFleet plugin: approval requests as gates, workload health, inventory, metric collector.

The two commands' modules (server: fleet-plugin-kubefleet, collector: fleet-metric-collector)
are imported on first use, so `python -m plugins.kubefleet.server` runs them cleanly.
"""

from __future__ import annotations

import importlib
from typing import Any

from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.fleet import HEALTH_CONDITION, KubeFleetHub, collector_names
from plugins.kubefleet.objects import COOKBOOKS, CURRENT, SEED, Cookbook
from plugins.kubefleet.servicers import CAPABILITIES, PLUGIN_NAME

__all__ = [
    "CAPABILITIES",
    "COOKBOOKS",
    "CURRENT",
    "HEALTH_CONDITION",
    "PLUGIN_NAME",
    "SEED",
    "CollectorOptions",
    "Cookbook",
    "KubeFleetConfig",
    "KubeFleetHub",
    "KubeFleetOptions",
    "KubeFleetPlugin",
    "MetricCollectorAgent",
    "collector_names",
    "main",
]

_LAZY = {
    "KubeFleetOptions": "plugins.kubefleet.server",
    "KubeFleetPlugin": "plugins.kubefleet.server",
    "main": "plugins.kubefleet.server",
    "CollectorOptions": "plugins.kubefleet.collector",
    "MetricCollectorAgent": "plugins.kubefleet.collector",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'plugins.kubefleet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
