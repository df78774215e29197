"""The fleet-orchestrator command: run the controller, print a what-if plan, print the CRD."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator import api, operate
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.provider import cluster_from_pb
from orchestrator.api.crd import crd_yaml
from orchestrator.engine.access import (
    ALL_NAMESPACES,
    INLINE_FLAG,
    AccessPolicy,
    parse_inline_namespaces,
)
from orchestrator.engine.observations import ClusterObs, OpKind
from orchestrator.engine.validate import Problem, parse_spec, validate_spec
from orchestrator.pipeline.multi import union_inventory
from orchestrator.pipeline.simulate import ModelFleet, Rollout, simulate

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.adapters import webhook
    from orchestrator.adapters.kube import KubeClient
    from orchestrator.controllers.approvals import GateLoop

__all__ = ["main"]

log = logging.getLogger("fleet-orchestrator")


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOST:PORT (e.g. :8080 or 127.0.0.1:9090)"
        )
    return host or "0.0.0.0", int(port)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleet-orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the controller")
    _controller_flags(run)
    _webhook_flags(run)
    run.add_argument(
        "--step-events",
        action="store_true",
        help="also record a Kubernetes Event for every step of a cluster (control plane, node "
        "pools, verifying, post-hook, service-in); by default a ClusterUpgrade gets Events for "
        "its start and its end, and its status records each step",
    )
    _plan_command(sub)
    sub.add_parser("version", help="print the version of this build")
    sub.add_parser("crd", help="print every CRD of the project as YAML")
    operate.add_commands(sub)
    return parser


def _controller_flags(run: argparse.ArgumentParser) -> None:
    """`run`: the apiserver, metrics, leader election, plugins' gates and who may use what."""
    run.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster config, then ~/.kube/config)",
    )
    run.add_argument("--namespace", default=None, help="watch one namespace (default: all)")
    run.add_argument(
        "--sync-period-seconds",
        type=float,
        default=30.0,
        help="re-reconcile every ClusterVersion and UpdateRun this often (default 30)",
    )
    run.add_argument(
        "--metrics-addr",
        type=_addr,
        default=("0.0.0.0", 8080),
        help="serve /metrics, /healthz and /readyz here (default :8080)",
    )
    run.add_argument(
        "--enable-leader-election",
        action="store_true",
        help="hold a coordination.k8s.io Lease; exit when it is lost",
    )
    run.add_argument(
        "--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default")
    )
    run.add_argument("--leader-election-id", default="fleet-orchestrator")
    run.add_argument(
        "--run-history",
        type=int,
        default=10,
        help="finished UpdateRuns kept per ClusterVersion (default 10)",
    )
    run.add_argument("--identity", default=None, help="this replica's name (default: host-uuid)")
    run.add_argument("--debug", action="store_true", help="debug logging")
    run.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME=HOST:PORT",
        help="a plugin whose gates (e.g. KubeFleet approval requests) the gate loop resolves; "
        "repeatable",
    )
    run.add_argument("--plugin-tls-ca", default=None, help="CA file: --plugin endpoints use TLS")
    run.add_argument("--plugin-tls-cert", default=None, help="client certificate for mTLS")
    run.add_argument("--plugin-tls-key", default=None, help="client key for mTLS")
    run.add_argument(
        "--orchestrator-namespace",
        default=None,
        help="the orchestrator's own namespace: FleetProvider and MetricSource Secrets are "
        "read here (default: $POD_NAMESPACE, else --namespace, else default)",
    )
    run.add_argument(
        INLINE_FLAG,
        action="append",
        default=[],
        metavar="NS[,NS]",
        help="namespaces whose ClusterVersions and UpdateRuns may set opsEndpoint, a check's "
        "endpoint or Prometheus address and inline TLS Secrets (default: the orchestrator's "
        "namespace only; '*' allows every namespace, which is unsafe: anyone who can edit a "
        "ClusterVersion could point the orchestrator at any plugin or URL); repeatable",
    )


def _webhook_flags(run: argparse.ArgumentParser) -> None:
    """`run`: the validating admission webhook and its certificates."""
    run.add_argument(
        "--webhook-addr",
        type=_addr,
        default=None,
        help="serve the validating admission webhook (POST /validate, HTTPS) here, e.g. :9443 "
        "(default: no webhook)",
    )
    run.add_argument(
        "--webhook-cert-dir",
        default=None,
        metavar="DIR",
        help="the webhook's tls.crt and tls.key (e.g. a cert-manager Secret mounted here; "
        "reloaded when they change); without it the orchestrator manages its own CA and "
        "certificate (--webhook-secret) and injects the CA into --webhook-config",
    )
    run.add_argument(
        "--webhook-config",
        default="fleet-orchestrator",
        metavar="NAME",
        help="self-managed certificates: the ValidatingWebhookConfiguration whose caBundle the "
        "orchestrator keeps ('' to leave it alone; default fleet-orchestrator)",
    )
    run.add_argument(
        "--webhook-secret",
        default="fleet-orchestrator-webhook-tls",
        metavar="NAME",
        help="self-managed certificates: the Secret in the orchestrator's namespace holding the "
        "CA and serving certificate every replica uses (default fleet-orchestrator-webhook-tls)",
    )
    run.add_argument(
        "--webhook-service",
        default="fleet-orchestrator-webhook",
        metavar="NAME",
        help="self-managed certificates: the Service the apiserver calls; its DNS names in the "
        "orchestrator's namespace go into the certificate (default fleet-orchestrator-webhook)",
    )
    run.add_argument(
        "--webhook-trusted-user",
        action="append",
        default=[],
        metavar="USER",
        help="the user whose writes of who-asked annotations the mutating webhook keeps (the "
        "orchestrator handing a ClusterVersion's requests to its run; default "
        "system:serviceaccount:NAMESPACE:fleet-orchestrator); repeatable",
    )
    run.add_argument(
        "--webhook-host",
        action="append",
        default=[],
        metavar="HOST",
        help="self-managed certificates: another DNS name or IP the certificate covers "
        "(e.g. 127.0.0.1 for a webhook configured by URL); repeatable",
    )


def _plan_command(sub: Any) -> None:
    """`plan`: the rollout plan of a ClusterVersion file, changing nothing."""
    p = sub.add_parser("plan", help="print the rollout plan of a ClusterVersion; changes nothing")
    p.add_argument("-f", "--file", required=True, help="the ClusterVersion YAML")
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="[NAME=]HOST:PORT",
        help="plugin HOST:PORT (default: spec.opsEndpoint); for a spec over several providers, "
        "NAME=HOST:PORT once per FleetProvider of spec.providerRefs",
    )
    p.add_argument("--tls-ca", default=None, help="CA file for a TLS endpoint")
    p.add_argument("--tls-cert", default=None)
    p.add_argument("--tls-key", default=None)
    p.add_argument(
        "--step-seconds",
        type=float,
        default=300.0,
        help="assumed duration of an upgrade step (default 300)",
    )
    p.add_argument(
        "--traffic-seconds",
        type=float,
        default=30.0,
        help="assumed duration of service-out / service-in (default 30)",
    )
    p.add_argument("--approve-all", action="store_true", help="assume manual stages get approved")


def main(argv: list[str] | None = None) -> int:
    """Entry point of fleet-orchestrator."""
    args = _parser().parse_args(argv)
    if args.command == "crd":
        sys.stdout.write(crd_yaml())
        return 0
    if args.command == "plan":
        return _plan(args)
    if args.command in operate.COMMANDS:
        return operate.run(args)
    if args.command == "version":
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            print(version("fleet-upgrade-orchestrator"))
        except PackageNotFoundError:
            print("unknown (not installed as a package)")
        return 0
    return _run(args)


#: glibc malloc arenas the controller's threads share (MALLOC_ARENA_MAX in the environment wins).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def _cap_malloc_arenas() -> None:
    """At most MALLOC_ARENAS glibc malloc arenas, before the threads start. Python hands what
    does not fit its own small-object allocator (dicts of more than a few keys, the objects'
    JSON, protobuf buffers) to malloc, which by default gives threads up to 8 arenas per core:
    the status writers, watches and gRPC threads each filled one with objects the caches then
    keep, and each arena kept its own free memory. Not glibc (musl, macOS): nothing to do."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    import ctypes  # noqa: PLC0415

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is not None and mallopt(_M_ARENA_MAX, MALLOC_ARENAS) != 1:
        log.debug("mallopt(M_ARENA_MAX) refused; malloc keeps its default arenas")


def _run(args: argparse.Namespace) -> int:
    from orchestrator.adapters.kube import KubeClient  # noqa: PLC0415
    from orchestrator.adapters.leader import LeaderElector  # noqa: PLC0415
    from orchestrator.adapters.probes import Probes, serve  # noqa: PLC0415
    from orchestrator.controllers.approvals import parse_plugin_flag  # noqa: PLC0415
    from orchestrator.controllers.manager import Controller  # noqa: PLC0415
    from orchestrator.controllers.updaterun import AlwaysLeader  # noqa: PLC0415
    from orchestrator.pipeline.driver import Fence  # noqa: PLC0415

    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    _cap_malloc_arenas()
    identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    try:
        plugins = [parse_plugin_flag(text) for text in args.plugin]
    except ValueError as err:
        print(f"fleet-orchestrator: {err}", file=sys.stderr)
        return 2
    metrics = Metrics()
    probes = Probes()
    host, port = args.metrics_addr
    serve(host, port, metrics.registry, probes)
    log.info("metrics, /healthz and /readyz on %s:%d", host, port)
    kube = KubeClient(args.kubeconfig)
    stop = threading.Event()
    lost = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    policy = _access_policy(args)
    if args.webhook_addr is not None:
        # Every replica serves admission, the leader and the standbys alike.
        threading.Thread(
            target=_serve_webhook, args=(args, kube, policy, stop), name="webhook", daemon=True
        ).start()
    elector: LeaderElector | None = None
    fence: Fence = AlwaysLeader()
    if args.enable_leader_election:
        elector = LeaderElector(
            kube, args.leader_election_namespace, args.leader_election_id, identity
        )
        probes.role = "standby"
        if not elector.acquire(stop):
            return 0

        def on_lost() -> None:
            lost.set()
            stop.set()

        elector.keep(stop, on_lost)
        fence = elector
    probes.role = "leader"
    controller = Controller(
        kube,
        metrics,
        args.namespace,
        args.sync_period_seconds,
        identity,
        fence=fence,
        history=args.run_history,
        stop=stop,
        probes=probes,
        policy=policy,
        step_events=args.step_events,
    )
    gates = _gate_loop(args, plugins, kube, metrics, stop, identity)
    gates.start()
    controller.run()
    gates.join()
    if elector is not None and not lost.is_set():
        elector.release()  # SIGTERM: the next replica takes over without waiting for expiry
    code = 0
    if lost.is_set():
        log.error("leadership lost: exiting so a new leader takes over")
        code = 1
    # Daemon threads may sit in blocking socket reads (watches); finalising the interpreter
    # under them can abort (seen as exit 134). Flush what we said and leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _access_policy(args: argparse.Namespace) -> AccessPolicy:
    """Who may use what: the orchestrator's namespace and the namespaces allowed inline
    endpoints (--allow-inline-endpoints-in), said in the log."""
    home = args.orchestrator_namespace or os.environ.get("POD_NAMESPACE") or args.namespace
    home = home or "default"
    policy = AccessPolicy(home, parse_inline_namespaces(args.allow_inline_endpoints_in, home))
    if ALL_NAMESPACES in policy.inline_namespaces:
        log.warning(
            "%s=*: every namespace may point the orchestrator at any plugin or URL", INLINE_FLAG
        )
    log.info(
        "inline endpoints allowed in: %s; FleetProvider/MetricSource Secrets read in %s",
        ",".join(sorted(policy.inline_namespaces)),
        home,
    )
    return policy


def _gate_loop(
    args: argparse.Namespace,
    plugins: list[tuple[str, str]],
    kube: KubeClient,
    metrics: Metrics,
    stop: threading.Event,
    identity: str,
) -> GateLoop:
    """The loop that resolves the gates of the --plugin endpoints (not started)."""
    from orchestrator.controllers.approvals import (  # noqa: PLC0415
        GateLoop,
        PluginEndpoint,
    )
    from plugins.sdk.client import ClientTLS  # noqa: PLC0415

    tls = None
    if args.plugin_tls_ca or args.plugin_tls_cert:
        tls = ClientTLS(args.plugin_tls_ca, args.plugin_tls_cert, args.plugin_tls_key)
    secrets_ns = args.namespace or args.leader_election_namespace
    return GateLoop(
        [PluginEndpoint(name, endpoint, tls) for name, endpoint in plugins],
        metrics,
        stop,
        resync_seconds=args.sync_period_seconds,
        read_secret=lambda ref: kube.read_secret(secrets_ns, ref.name)[ref.key],
        caller=identity,
    )


def _serve_webhook(
    args: argparse.Namespace, kube: KubeClient, policy: AccessPolicy, stop: threading.Event
) -> None:
    """Serve the admission webhook with the access check over its own caches, and keep its
    self-managed certificate (unless --webhook-cert-dir names one).

    A webhook that cannot start (certificate, Secret, port) is retried every 30 s and never
    stops the controller: the configuration's failurePolicy is Ignore, so meanwhile the
    apiserver admits our kinds and the controllers validate them as before.
    """
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from orchestrator.adapters import webhook  # noqa: PLC0415
    from orchestrator.adapters.cache import AccessCatalog  # noqa: PLC0415

    catalog = AccessCatalog(kube, policy)
    for cache in catalog.caches():
        threading.Thread(
            target=cache.run, args=(stop,), name="webhook-catalog", daemon=True
        ).start()

    def access(namespace: str, spec: api.ClusterVersionSpec | api.UpdateRunSpec) -> list[Problem]:
        if not all(cache.synced.is_set() for cache in catalog.caches()):
            raise RuntimeError("FleetProviders and MetricSources are not listed yet")
        found = catalog.check(namespace, spec)
        if isinstance(found, list) and found:
            # Confirm a refusal on a fresh read: the caches may not have seen yet a
            # FleetProvider or MetricSource applied together with the spec.
            for cache, plural in zip(
                catalog.caches(), (api.FLEET_PROVIDER_PLURAL, api.METRIC_SOURCE_PLURAL), strict=True
            ):
                for obj in kube.list_objects(plural)[0]:
                    cache.put(obj)
            found = catalog.check(namespace, spec)
        return found if isinstance(found, list) else []

    host, port = args.webhook_addr
    cert: webhook.ServingCert | None = None
    origin = ""
    workdir = None if args.webhook_cert_dir else Path(tempfile.mkdtemp(prefix="fleet-webhook-"))
    while not stop.is_set():
        try:
            if cert is None:
                cert, origin = _webhook_cert(args, kube, policy.home, workdir, stop)
            trusted = frozenset(args.webhook_trusted_user or [_own_user(policy.home)])
            webhook.WebhookServer(host, port, cert, access, trusted).start()
        except Exception as err:
            log.error(
                "admission webhook not serving (retrying in 30s; meanwhile the apiserver admits "
                "ClusterVersions and UpdateRuns and the controllers validate them): %s",
                err,
            )
            stop.wait(30.0)
            continue
        log.info(
            "admission webhook on https://%s:%d%s, certificate %s", host, port, webhook.PATH, origin
        )
        return


def _own_user(home: str) -> str:
    """The orchestrator's own username as the apiserver authenticates it (the installed
    ServiceAccount fleet-orchestrator in its namespace)."""
    return f"system:serviceaccount:{home}:fleet-orchestrator"


def _webhook_cert(
    args: argparse.Namespace,
    kube: KubeClient,
    home: str,
    workdir: Path | None,
    stop: threading.Event,
) -> tuple[webhook.ServingCert, str]:
    """The files from --webhook-cert-dir, or the self-managed pair (written to workdir) kept
    current in a thread."""
    from pathlib import Path  # noqa: PLC0415

    from orchestrator.adapters import webhook, webhook_certs  # noqa: PLC0415
    from orchestrator.adapters.kube import NotFound  # noqa: PLC0415

    if args.webhook_cert_dir or workdir is None:
        directory = Path(args.webhook_cert_dir)
        return webhook.ServingCert(directory / "tls.crt", directory / "tls.key"), str(directory)
    config = args.webhook_config

    def inject(ca: bytes) -> None:
        try:
            if kube.set_webhook_ca_bundle(config, ca, mutating=True):
                log.info("webhook: CA bundle injected into MutatingWebhookConfiguration %s", config)
        except NotFound:  # an install from before the who-asked webhook: validation only
            pass
        if kube.set_webhook_ca_bundle(config, ca):
            log.info("webhook: CA bundle injected into ValidatingWebhookConfiguration %s", config)

    hosts = webhook_certs.self_managed_hosts(args.webhook_service, home, args.webhook_host)
    managed = webhook_certs.SelfManaged(
        _WebhookSecret(kube, home, args.webhook_secret),
        hosts,
        inject if config else None,
        workdir,
    )
    threading.Thread(target=managed.run, args=(stop,), name="webhook-cert", daemon=True).start()
    return managed.cert, f"self-managed (Secret {home}/{args.webhook_secret}, {', '.join(hosts)})"


class _WebhookSecret:
    """webhook_certs.SecretStore over one Secret in the orchestrator's namespace."""

    def __init__(self, kube: KubeClient, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.labels = {
            "app.kubernetes.io/name": "fleet-orchestrator",
            "app.kubernetes.io/component": "webhook",
        }

    def read(self) -> tuple[dict[str, bytes], str] | None:
        return self.kube.read_secret_versioned(self.namespace, self.name)

    def create(self, data: dict[str, bytes]) -> bool:
        return self.kube.write_secret(self.namespace, self.name, data, None, self.labels)

    def replace(self, data: dict[str, bytes], resource_version: str) -> bool:
        return self.kube.write_secret(
            self.namespace, self.name, data, resource_version, self.labels
        )


def _plan(args: argparse.Namespace) -> int:
    with open(args.file, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle) or {}
    parsed = parse_spec(doc.get("spec"))
    problems = parsed if isinstance(parsed, list) else validate_spec(parsed)
    if isinstance(parsed, list) or problems:
        for problem in problems:
            print(f"invalid: {problem}", file=sys.stderr)
        return 2
    spec = parsed
    endpoints = _plan_endpoints(spec, args.endpoint)
    if isinstance(endpoints, str):
        print(f"error: {endpoints}", file=sys.stderr)
        return 2
    inventories: dict[str, dict[str, ClusterObs]] = {}
    for name, endpoint in endpoints.items():
        read = _plan_inventory(args, spec, endpoint)
        if isinstance(read, str):
            print(f"error: {read}", file=sys.stderr)
            return 1
        inventories[name] = read
    if spec.provider_refs:
        union = union_inventory(inventories)
        if isinstance(union, list):
            for problem in union:
                print(f"invalid: {problem}", file=sys.stderr)
            return 2
        clusters = {cid: obs for cid, (_, obs) in union.items()}
    else:
        clusters = next(iter(inventories.values()))
    durations = {k: args.step_seconds for k in OpKind}
    durations[OpKind.SERVICE_OUT] = durations[OpKind.SERVICE_IN] = args.traffic_seconds
    fleet = ModelFleet(clusters, durations=durations)
    approved = (
        frozenset(s.name for s in (spec.strategy.stages or []))
        if (args.approve_all and spec.strategy)
        else frozenset()
    )
    outcome = simulate(fleet, spec, approved=approved)
    if outcome.problems:
        for text in outcome.problems:
            print(f"invalid: {text}", file=sys.stderr)
        return 2
    print(_render(spec, fleet, outcome))
    return 0


def _plan_endpoints(spec: api.ClusterVersionSpec, given: list[str]) -> dict[str, str] | str:
    """Where `plan` reads each inventory (FleetProvider name, or "" for one plugin, to HOST:PORT),
    or what is wrong with --endpoint, naming the flag and the fix."""
    named: dict[str, str] = {}
    plain: list[str] = []
    for value in given:
        name, sep, endpoint = value.partition("=")
        if sep:
            named[name.strip()] = endpoint.strip()
        else:
            plain.append(value.strip())
    if spec.provider_refs:
        refs = [r.name for r in spec.provider_refs]
        unknown = sorted(set(named) - set(refs))
        missing = [r for r in refs if r not in named]
        if plain or unknown or missing:
            return (
                "the spec runs over several providers (spec.providerRefs: "
                f"{', '.join(refs)}); pass --endpoint NAME=HOST:PORT once for each of them"
                + (f" (missing: {', '.join(missing)})" if missing else "")
                + (f" (not in spec.providerRefs: {', '.join(unknown)})" if unknown else "")
                + " (kubectl get fleetprovider NAME)"
            )
        return {r: named[r] for r in refs}
    if named or len(plain) > 1:
        return (
            "--endpoint NAME=HOST:PORT is for a spec with spec.providerRefs; this one names one "
            "plugin: pass --endpoint HOST:PORT once"
        )
    if plain:
        return {"": plain[0]}
    if spec.ops_endpoint is None:
        return (
            "the spec names a FleetProvider (spec.providerRef); pass its endpoint with "
            "--endpoint HOST:PORT (kubectl get fleetprovider NAME)"
        )
    return {"": spec.ops_endpoint.endpoint}


def _plan_inventory(
    args: argparse.Namespace, spec: api.ClusterVersionSpec, endpoint: str
) -> dict[str, ClusterObs] | str:
    """One plugin's inventory for `plan`, or why it could not be read. An endpoint given on the
    command line is plaintext unless a TLS flag is given; spec.opsEndpoint's says itself."""
    from plugins.sdk.client import ClientTLS, PluginCallError, PluginClient  # noqa: PLC0415

    from_spec = not args.endpoint
    insecure = bool(from_spec and spec.ops_endpoint and spec.ops_endpoint.insecure)
    tls = None
    if args.tls_ca or args.tls_cert or (from_spec and not insecure):
        tls = ClientTLS(ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key)
    client = PluginClient(endpoint, tls=tls, caller="fleet-orchestrator-plan")
    try:
        return {c.id: cluster_from_pb(c) for c in client.list_clusters()}
    except PluginCallError as err:
        return f"cannot list clusters from {endpoint}: {err}"
    finally:
        client.close()


def _render(spec: api.ClusterVersionSpec, fleet: ModelFleet, outcome: Rollout) -> str:
    seconds, settled = outcome.seconds, outcome.settled
    decision = outcome.last.decision if outcome.last is not None else None
    waves: dict[float, list[str]] = defaultdict(list)
    for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True):
        if kind is OpKind.SERVICE_OUT:
            waves[at].append(cid)
    lines = [f"requiredAvailableCount: {spec.required_available_count}"]
    for stage in outcome.stages:
        lines.append(f"stage {stage.name}: {stage.total} cluster(s)")
    for n, (at, ids) in enumerate(sorted(waves.items()), start=1):
        shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
        lines.append(f"  wave {n} at +{_hms(at)}: {len(ids)} cluster(s): {shown}")
    lines.append(f"lowest available in service: {fleet.min_available_in_service}")
    phase = decision.phase.value if decision else "Pending"
    if settled:
        lines.append(f"estimated time: {_hms(seconds)} ({phase})")
    else:
        lines.append(f"stops after {_hms(seconds)}: {decision.message if decision else phase}")
    return "\n".join(lines)


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


if __name__ == "__main__":
    sys.exit(main())
