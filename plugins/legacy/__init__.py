"""The legacy bridge: plugin servers written for the original multicluster-upgrade-operator,
served over our plugin contract with durable request-id idempotency and watches."""

from plugins.legacy.server import PLUGIN_NAME, BridgeOptions, LegacyBridge, main

__all__ = ["PLUGIN_NAME", "BridgeOptions", "LegacyBridge", "main"]
