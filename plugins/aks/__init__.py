"""The AKS plugin: AKS managed clusters' inventory, control-plane, node-pool and node-image
upgrades as Azure Resource Manager long-running operations, preflight from upgrade profiles and
planned maintenance reported as windows, served over the plugin contract."""

from plugins.aks.config import AksConfig, ConfigError, aks_fleet_id, load_config, parse_config
from plugins.aks.server import AksPlugin, AksPluginOptions, main
from plugins.aks.servicers import PLUGIN_NAME, capabilities

__all__ = [
    "PLUGIN_NAME",
    "AksConfig",
    "AksPlugin",
    "AksPluginOptions",
    "ConfigError",
    "aks_fleet_id",
    "capabilities",
    "load_config",
    "main",
    "parse_config",
]
