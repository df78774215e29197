"""The plugin SDK: everything a plugin imports, from this one module.

A plugin writes ``from plugins.sdk import PluginServer, OperationStore, NotFound, ...`` and
never names a module inside this package: those modules (cli, client, config, endpoint_errors,
errors, identity, interceptors, journal, kube, kubecache, operations, preflight, revisions,
server, servicers, validate, versions) are how the SDK is built, free to move. The import-linter
contract "plugins import the SDK only through plugins.sdk" (pyproject.toml) holds every
plugin to this, and tests/contract/test_sdk_surface.py pins the names below, so a name leaves
the surface only on purpose. The conformance kit is a sub-surface of its own,
``plugins.sdk.conformance`` (it needs pytest, which a plugin at run time does not).

What is here, by the question a plugin author asks:
- serving: FleetServer, ServedFleet, ServeOptions (what a plugin's options extend), PluginServer,
  PluginServicers, ServerTLS, serve, run_until_signal, add_server_args,
  server_tls_from_args, configure_logging, and the command line (plugin_parser,
  parse_plugin_args, serve_args / ServeArgs, run_plugin, announce_ready, RunningPlugin);
- identity: StaticIdentity, package_version, always_ready;
- the gRPC services over a backend: ClusterServicer, HealthServicer and the backend protocols
  (ClusterBackend, PreflightBackend, HealthBackend, ListsChanges), caller_of, and
  RevisionLog (the inventory's revisions a ListsChanges backend keeps);
- errors a backend raises (PluginError and its kinds, Reason) and preflight verdicts;
- operations: OperationStore, TERMINAL_STATES, kind_name, and the kinds and states under short
  names (OP_CONTROL_PLANE, OP_NODE_POOL, OP_SERVICE_OUT, OP_SERVICE_IN, OP_RUNNING,
  OP_SUCCEEDED, OP_FAILED);
- request checks and paging: require*, check_*, encode/decode_page_token, page_request
  (PageRequest, KeyPage);
- configuration files: read_yaml, validate_model and their error placement helpers;
- Kubernetes versions: Version, parse_version, compare_versions, is_newer_version,
  version_meets, is_downgrade (the versions module's names, qualified for a flat namespace);
- Kubernetes access: Kube, Resource, the KubeError kinds, Informer and CachedObject, and
  caches_readiness / require_listed over a plugin's informers;
- endpoints the plugin calls: classify_http / classify_exception / classify_grpc, Failure,
  log_raw, redact, url_secrets, LOG_HINT (messages safe for a status; raw text to the log);
- calling a plugin: PluginClient, ClientTLS, PluginCallError (its code, reason, retryable).
"""

from plugins.sdk.cli import (
    RunningPlugin,
    announce_ready,
    parse_plugin_args,
    plugin_parser,
    run_plugin,
)
from plugins.sdk.client import ClientTLS, PluginCallError, PluginClient
from plugins.sdk.config import (
    field_path,
    place_problem,
    read_yaml,
    validate_model,
    validation_problems,
)
from plugins.sdk.endpoint_errors import (
    LOG_HINT,
    Failure,
    classify_exception,
    classify_grpc,
    classify_http,
    log_raw,
    plugin_error_message,
    redact,
    url_secrets,
)
from plugins.sdk.errors import (
    ERROR_DOMAIN,
    AlreadyExists,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PluginError,
    Reason,
    Unavailable,
    Unimplemented,
)
from plugins.sdk.identity import StaticIdentity, always_ready, package_version
from plugins.sdk.kube import Kube, KubeConflict, KubeError, KubeGone, KubeNotFound, Resource
from plugins.sdk.kubecache import CachedObject, Informer, caches_readiness, require_listed
from plugins.sdk.operations import (
    OP_CONTROL_PLANE,
    OP_FAILED,
    OP_NODE_POOL,
    OP_RUNNING,
    OP_SERVICE_IN,
    OP_SERVICE_OUT,
    OP_SUCCEEDED,
    TERMINAL_STATES,
    OperationStore,
    kind_name,
)
from plugins.sdk.preflight import (
    accepted,
    refused_later,
    refused_never,
    verdict_of,
    verdict_of_check,
)
from plugins.sdk.revisions import RevisionLog
from plugins.sdk.server import (
    FleetServer,
    PluginServer,
    PluginServicers,
    ServeArgs,
    ServedFleet,
    ServeOptions,
    ServerTLS,
    add_server_args,
    configure_logging,
    run_until_signal,
    serve,
    serve_args,
    server_tls_from_args,
)
from plugins.sdk.servicers import (
    ClusterBackend,
    ClusterServicer,
    HealthBackend,
    HealthServicer,
    ListsChanges,
    PreflightBackend,
    caller_of,
)
from plugins.sdk.validate import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    KeyPage,
    PageRequest,
    check_page_size,
    check_version,
    decode_page_token,
    encode_page_token,
    page_request,
    require,
    require_all,
    require_request_id,
)
from plugins.sdk.versions import Version, is_downgrade
from plugins.sdk.versions import compare as compare_versions
from plugins.sdk.versions import is_newer as is_newer_version
from plugins.sdk.versions import meets as version_meets
from plugins.sdk.versions import parse as parse_version

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "ERROR_DOMAIN",
    "LOG_HINT",
    "MAX_PAGE_SIZE",
    "OP_CONTROL_PLANE",
    "OP_FAILED",
    "OP_NODE_POOL",
    "OP_RUNNING",
    "OP_SERVICE_IN",
    "OP_SERVICE_OUT",
    "OP_SUCCEEDED",
    "TERMINAL_STATES",
    "AlreadyExists",
    "CachedObject",
    "ClientTLS",
    "ClusterBackend",
    "ClusterServicer",
    "Conflict",
    "FailedPrecondition",
    "Failure",
    "FleetServer",
    "HealthBackend",
    "HealthServicer",
    "Informer",
    "InvalidArgument",
    "KeyPage",
    "Kube",
    "KubeConflict",
    "KubeError",
    "KubeGone",
    "KubeNotFound",
    "ListsChanges",
    "NotFound",
    "OperationStore",
    "PageRequest",
    "PluginCallError",
    "PluginClient",
    "PluginError",
    "PluginServer",
    "PluginServicers",
    "PreflightBackend",
    "Reason",
    "Resource",
    "RevisionLog",
    "RunningPlugin",
    "ServeArgs",
    "ServeOptions",
    "ServedFleet",
    "ServerTLS",
    "StaticIdentity",
    "Unavailable",
    "Unimplemented",
    "Version",
    "accepted",
    "add_server_args",
    "always_ready",
    "announce_ready",
    "caches_readiness",
    "caller_of",
    "check_page_size",
    "check_version",
    "classify_exception",
    "classify_grpc",
    "classify_http",
    "compare_versions",
    "configure_logging",
    "decode_page_token",
    "encode_page_token",
    "field_path",
    "is_downgrade",
    "is_newer_version",
    "kind_name",
    "log_raw",
    "package_version",
    "page_request",
    "parse_plugin_args",
    "parse_version",
    "place_problem",
    "plugin_error_message",
    "plugin_parser",
    "read_yaml",
    "redact",
    "refused_later",
    "refused_never",
    "require",
    "require_all",
    "require_listed",
    "require_request_id",
    "run_plugin",
    "run_until_signal",
    "serve",
    "serve_args",
    "server_tls_from_args",
    "url_secrets",
    "validate_model",
    "validation_problems",
    "verdict_of",
    "verdict_of_check",
    "version_meets",
]
