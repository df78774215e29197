"""The EKS plugin: Amazon EKS clusters' inventory, control-plane and managed node group upgrades
through the EKS API (boto3), preflight from EKS's offers and upgrade insights, served over the
plugin contract."""

from plugins.eks.config import ConfigError, EksConfig, load_config, parse_config
from plugins.eks.server import EksPlugin, EksPluginOptions, main
from plugins.eks.servicers import CAPABILITIES, PLUGIN_NAME

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "ConfigError",
    "EksConfig",
    "EksPlugin",
    "EksPluginOptions",
    "load_config",
    "main",
    "parse_config",
]
