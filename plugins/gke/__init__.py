"""The GKE plugin: GKE clusters' inventory, control-plane and node-pool upgrades through the GKE
API, and traffic drain through global backend services, served over the plugin contract."""

from plugins.gke.config import ConfigError, GkeConfig, load_config, parse_config
from plugins.gke.server import GkePlugin, GkePluginOptions, main
from plugins.gke.servicers import CAPABILITIES, PLUGIN_NAME

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "ConfigError",
    "GkeConfig",
    "GkePlugin",
    "GkePluginOptions",
    "load_config",
    "main",
    "parse_config",
]
