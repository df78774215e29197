"""What every plugin shares: server bootstrap, client helper, errors and the conformance kit."""

from plugins.sdk.client import ClientTLS, PluginCallError, PluginClient
from plugins.sdk.errors import PluginError
from plugins.sdk.server import (
    PluginServer,
    PluginServicers,
    ServerTLS,
    add_server_args,
    run_until_signal,
    serve,
    server_tls_from_args,
)

__all__ = [
    "ClientTLS",
    "PluginCallError",
    "PluginClient",
    "PluginError",
    "PluginServer",
    "PluginServicers",
    "ServerTLS",
    "add_server_args",
    "run_until_signal",
    "serve",
    "server_tls_from_args",
]
