"""Open Cluster Management plugin: ManagedCluster inventory, taint service-out, upgrades, over one
or several hubs."""

from plugins.ocm.config import ConfigError, OcmConfig, load_config, parse_config
from plugins.ocm.fleet import OcmFleet
from plugins.ocm.hubs import OcmHubs
from plugins.ocm.server import OcmOptions, OcmPlugin, main
from plugins.ocm.servicers import CAPABILITIES, PLUGIN_NAME

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "ConfigError",
    "OcmConfig",
    "OcmFleet",
    "OcmHubs",
    "OcmOptions",
    "OcmPlugin",
    "load_config",
    "main",
    "parse_config",
]
