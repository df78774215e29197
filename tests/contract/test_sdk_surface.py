"""The plugin SDK's public surface: `plugins.sdk.__all__`, pinned name by name.

A plugin imports only `plugins.sdk` (the import-linter contract "plugins import the SDK only
through plugins.sdk" holds it to that). This test makes every change of the surface deliberate:
a name added or removed fails here until the list below says so too (as httpx pins its own
`__all__`), and every listed name must resolve to something the SDK defines.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import plugins.sdk

SURFACE = [
    "AlreadyExists",
    "CachedObject",
    "ClientTLS",
    "ClusterBackend",
    "ClusterServicer",
    "Conflict",
    "DEFAULT_PAGE_SIZE",
    "ERROR_DOMAIN",
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
    "LOG_HINT",
    "ListsChanges",
    "MAX_PAGE_SIZE",
    "NotFound",
    "OP_CONTROL_PLANE",
    "OP_FAILED",
    "OP_NODE_POOL",
    "OP_RUNNING",
    "OP_SERVICE_IN",
    "OP_SERVICE_OUT",
    "OP_SUCCEEDED",
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
    "TERMINAL_STATES",
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


def test_the_surface_is_exactly_the_pinned_names() -> None:
    assert sorted(plugins.sdk.__all__) == SURFACE
    assert len(set(plugins.sdk.__all__)) == len(plugins.sdk.__all__), "a name listed twice"


def test_every_name_resolves_to_what_the_sdk_defines() -> None:
    for name in SURFACE:
        value = getattr(plugins.sdk, name)  # AttributeError names the missing one
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("plugins.sdk."), (name, value.__module__)


def test_star_import_gives_the_surface_and_nothing_private() -> None:
    namespace: dict[str, object] = {}
    exec("from plugins.sdk import *", namespace)  # the import a plugin may write
    namespace.pop("__builtins__")
    assert sorted(namespace) == SURFACE


def test_the_versions_names_are_the_versions_rules() -> None:
    # The surface renames the versions module's functions for a flat namespace; the behaviour
    # is the module's own (a bare target is met by a provider build; no downgrade to it).
    assert plugins.sdk.compare_versions("1.29.4", "1.30.0") == -1
    assert plugins.sdk.is_newer_version("1.30.0", "1.29.9")
    assert plugins.sdk.version_meets("1.29.1-gke.1589020", "1.29.1")
    assert not plugins.sdk.is_downgrade("1.29.1-gke.100", "1.29.1")
    assert plugins.sdk.parse_version("v1.29") == plugins.sdk.Version(1, 29, 0, 1, ())


def test_importing_the_surface_does_not_load_the_conformance_kit() -> None:
    # The kit (plugins.sdk.conformance) needs pytest; a plugin process must not.
    probe = (
        "import sys, plugins.sdk; "
        "loaded = [m for m in ('pytest', 'plugins.sdk.conformance') if m in sys.modules]; "
        "print(','.join(loaded))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
