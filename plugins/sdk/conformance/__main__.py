"""Command line of the conformance kit: python -m plugins.sdk.conformance --endpoint HOST:PORT."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from plugins.sdk.client import ClientTLS
from plugins.sdk.conformance.runner import run_conformance
from plugins.sdk.conformance.target import restart_command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m plugins.sdk.conformance",
        description="Check a plugin endpoint against the fleetupgrade.plugin.v1 contract. "
        "Arguments after -- go to pytest (e.g. -- -v -k inventory).",
    )
    parser.add_argument("--endpoint", required=True, metavar="HOST:PORT")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA bundle (PEM) to verify the plugin")
    parser.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM) for mTLS")
    parser.add_argument("--tls-key", metavar="FILE", help="client private key (PEM) for mTLS")
    parser.add_argument(
        "--tls-server-name", metavar="NAME", help="name to expect in the plugin's certificate"
    )
    parser.add_argument(
        "--cluster",
        metavar="ID",
        help="cluster for the mutating checks (default: the first listed cluster); the kit "
        "takes it out of service and back, or upgrades it to its current version",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds an operation may take to finish (default %(default)s)",
    )
    parser.add_argument(
        "--restart-command",
        metavar="CMD",
        help="shell command that restarts the plugin on the same endpoint; with it the kit "
        "checks that a plugin declaring DURABLE_OPERATIONS keeps its operations",
    )
    parser.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the suite; the exit code is pytest's (0 = conformant)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_server_name:
        tls = ClientTLS(
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
            server_name=args.tls_server_name,
        )
    return run_conformance(
        args.endpoint,
        tls,
        args.cluster,
        timeout=args.timeout,
        pytest_args=args.pytest_args,
        restart=restart_command(args.restart_command) if args.restart_command else None,
    )


if __name__ == "__main__":
    sys.exit(main())
