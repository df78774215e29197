"""The command line of the operator verbs: their arguments, the kubeconfig context, dispatch to
the read model, rendering and write verbs, and `status --watch`."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator import api
from orchestrator.adapters.kube import KubeClient, KubeError
from orchestrator.operate.read import (
    OperateError,
    Outcome,
    UpgradeCache,
    WaitCode,
    history,
    snapshot,
    wait_outcome,
)
from orchestrator.operate.render import render_history, renderable
from orchestrator.operate.verbs import Request, approve, retry, set_state, skip

__all__ = ["COMMANDS", "add_commands", "run"]


COMMANDS = ("status", "history", "wait", "approve", "retry", "skip", "stop", "resume")


@dataclass(frozen=True)
class _Context:
    namespace: str = "default"
    user: str = ""


def _context(kubeconfig: str | None) -> _Context:
    """The namespace and user of the kubeconfig's current context, like kubectl."""
    paths = [kubeconfig] if kubeconfig else (os.environ.get("KUBECONFIG") or "").split(os.pathsep)
    paths = [p for p in paths if p] or [str(Path.home() / ".kube" / "config")]
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        current = data.get("current-context")
        for ctx in data.get("contexts") or []:
            if ctx.get("name") == current:
                body = ctx.get("context") or {}
                return _Context(
                    str(body.get("namespace") or "default"), str(body.get("user") or "")
                )
    return _Context()


def _requested_by(args: argparse.Namespace, context: _Context) -> str:
    """--requested-by, else the kubeconfig context's user, else the local login name."""
    if getattr(args, "requested_by", None):
        return str(args.requested_by)
    if context.user:
        return context.user
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster config, then ~/.kube/config)",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace of the object (default: the kubeconfig context's, else default)",
    )


def _who(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", default=None, help="why (recorded with the request)")
    p.add_argument(
        "--requested-by",
        default=None,
        metavar="WHO",
        help="who asks (default: the kubeconfig context's user)",
    )


def _wait_for(text: str) -> str | None:
    """--for: None for completed, else the stage's name."""
    if text == "completed":
        return None
    if text.startswith("stage=") and text[len("stage=") :]:
        return text[len("stage=") :]
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither 'completed' nor 'stage=NAME' (e.g. --for stage=canary)"
    )


def _timeout(text: str) -> float:
    try:
        seconds = api.parse_duration(text).total_seconds()
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the timeout must be positive, e.g. 10m")
    return seconds


def add_commands(sub: Any) -> None:
    """Register the operator verbs on fleet-orchestrator's sub-command parser."""
    p = sub.add_parser(
        "status", help="show a ClusterVersion's or UpdateRun's progress (all when NAME is omitted)"
    )
    _common(p)
    p.add_argument("name", nargs="?", help="ClusterVersion or UpdateRun")
    p.add_argument("-w", "--watch", action="store_true", help="re-render on every change")
    p.add_argument(
        "--interval", type=float, default=2.0, help="--watch: seconds between reads (default 2)"
    )
    p = sub.add_parser("history", help="list the runs of a ClusterVersion, newest first")
    _common(p)
    p.add_argument("name", help="ClusterVersion")
    p = sub.add_parser(
        "wait",
        help="wait until a run completes (or a stage does); the exit code says how it ended",
        description="Wait for the current run of a ClusterVersion (or an UpdateRun) to end, or "
        "for one of its stages to complete. Exit codes: 0 reached; 1 error (no such object or "
        "stage, the apiserver refused); 3 Halted; 4 Failed (the run ended with failed clusters, "
        "or the stage failed); 5 Invalid; 6 will not get there (the run was stopped, the stage "
        "skipped); 124 --timeout passed first. The reason is printed either way.",
    )
    _common(p)
    p.add_argument("name", help="ClusterVersion (its current run) or UpdateRun")
    p.add_argument(
        "--for",
        dest="wait_for",
        default="completed",
        metavar="completed|stage=NAME",
        type=_wait_for,
        help="completed: the run ended successfully (default); stage=NAME: that stage completed",
    )
    p.add_argument(
        "--timeout",
        default=None,
        type=_timeout,
        metavar="DURATION",
        help="give up after this long, exit 124 (e.g. 30s, 10m, 2h; default: wait forever)",
    )
    p.add_argument("--interval", type=float, default=2.0, help="seconds between reads (default 2)")
    p = sub.add_parser("approve", help="approve a stage with approval: Manual")
    _common(p)
    p.add_argument("name", help="ClusterVersion or UpdateRun")
    p.add_argument("stage", help="the stage's name")
    p = sub.add_parser(
        "retry", help="retry Failed, Blocked or Skipped clusters (a new attempt, same targets)"
    )
    _common(p)
    p.add_argument("name", help="ClusterVersion or UpdateRun")
    p.add_argument("clusters", nargs="+", metavar="CLUSTER", help="cluster id")
    _who(p)
    p = sub.add_parser(
        "skip", help="skip clusters, or a whole stage (--stage): the run does not upgrade them"
    )
    _common(p)
    p.add_argument("name", help="ClusterVersion or UpdateRun")
    p.add_argument("clusters", nargs="*", metavar="CLUSTER", help="cluster id")
    p.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="STAGE",
        help="skip this stage: its clusters not started are Skipped (repeatable)",
    )
    _who(p)
    for verb, what in (
        ("stop", "stop a run: admit no new cluster, finish and service in those in flight"),
        ("resume", "resume a stopped run"),
    ):
        p = sub.add_parser(verb, help=what)
        _common(p)
        p.add_argument("name", help="UpdateRun, or a ClusterVersion (its current run)")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one operator verb; 0 on success, 1 with the error on stderr (`wait`: WaitCode)."""
    out = out or sys.stdout
    context = _context(args.kubeconfig)
    namespace = args.namespace or context.namespace
    try:
        kube = KubeClient(args.kubeconfig)
    except Exception as error:  # kubeconfig loading raises several kinds
        print(
            f"error: cannot load the kubeconfig ({error}); pass --kubeconfig FILE",
            file=sys.stderr,
        )
        return 1
    try:
        return _dispatch(kube, namespace, args, out, Request(_requested_by(args, context)))
    except OperateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KubeError as error:
        print(f"error: the apiserver answered {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        kube.close()


def _dispatch(
    kube: KubeClient, namespace: str, args: argparse.Namespace, out: TextIO, who: Request
) -> int:
    command = args.command
    if command == "status":
        read = _status_reader(kube, namespace, args.name, args.watch)
        if args.watch:
            _watch(read, out, args.interval)
        else:
            _print(read(), out)
    elif command == "history":
        out.write(render_history(namespace, args.name, history(kube, namespace, args.name)))
    elif command == "wait":
        return _wait(kube, namespace, args.name, args.wait_for, args.timeout, args.interval, out)
    elif command == "approve":
        line, notes = approve(kube, namespace, args.name, args.stage)
        print(line, file=out)
        for note in notes:
            print(note, file=sys.stderr)
    elif command in ("retry", "skip"):
        request = Request(who.requested_by, args.reason)
        if command == "retry":
            line, notes = retry(kube, namespace, args.name, args.clusters, request)
        else:
            line, notes = skip(kube, namespace, args.name, args.clusters, request, args.stage)
        print(line, file=out)
        for note in notes:
            print(note, file=sys.stderr)
    else:
        state = api.RunState.STOP if command == "stop" else api.RunState.RUN
        print(set_state(kube, namespace, args.name, state), file=out)
    return 0


def _wait(
    kube: KubeClient,
    namespace: str,
    name: str,
    stage: str | None,
    timeout: float | None,
    interval: float,
    out: TextIO,
) -> int:
    """Poll until wait_outcome says it ended (or the timeout passes); print each change of the
    run's phase and message on the way, then the outcome (stderr when it is not success)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    while True:
        outcome = wait_outcome(kube, namespace, name, stage)
        if outcome is not None:
            break
        snap = snapshot(kube, namespace, name, upgrades=lambda _run: [])
        line = f"{snap.kind} {name}: {snap.phase}" + (f": {snap.message}" if snap.message else "")
        if line != last:
            print(f"{time.strftime('%H:%M:%S', time.gmtime())} {line}", file=out, flush=True)
            last = line
        if deadline is not None and time.monotonic() >= deadline:
            outcome = Outcome(WaitCode.TIMEOUT, f"timed out after {timeout:g}s waiting; {line}")
            break
        pause = interval if deadline is None else min(interval, deadline - time.monotonic())
        time.sleep(max(0.0, pause))
    print(outcome.line, file=out if outcome.code == WaitCode.REACHED else sys.stderr)
    return int(outcome.code)


def _status_reader(
    kube: KubeClient, namespace: str, name: str | None, watch: bool = False
) -> Callable[[], Text]:
    if name:
        cache = UpgradeCache(kube, namespace) if watch else None
        return lambda: renderable(snapshot(kube, namespace, name, cache))

    def every() -> Text:
        cvs, _ = kube.list_objects(api.PLURAL, namespace)
        runs, _ = kube.list_objects(api.UPDATE_RUN_PLURAL, namespace)
        names = [o["metadata"]["name"] for o in cvs]
        names += [
            o["metadata"]["name"]
            for o in runs
            if api.LABEL_CLUSTER_VERSION not in (o["metadata"].get("labels") or {})
        ]
        if not names:
            return Text(f"no ClusterVersions or UpdateRuns in namespace {namespace}")
        return Text("\n\n").join(renderable(snapshot(kube, namespace, n)) for n in names)

    return every


def _print(text: Text, out: TextIO) -> None:
    """Styled on a terminal, plain text otherwise (a pipe, a log)."""
    if out.isatty():
        Console(file=out, highlight=False, soft_wrap=True).print(text)
    else:
        out.write(text.plain + "\n")


def _watch(read_once: Callable[[], Text], out: TextIO, interval: float) -> None:
    """Re-render whenever what `read` returns changes: live on a terminal, appended otherwise.

    A failed read (the apiserver away, the object deleted) is shown and read again.
    """

    def read() -> Text:
        try:
            return read_once()
        except (OperateError, KubeError) as error:
            return Text(
                f"error: {error} (reading again every {interval:g}s; Ctrl-C to leave)",
                style="bold red",
            )

    if out.isatty():
        text = read()
        console = Console(file=out, highlight=False)
        with Live(text, console=console, auto_refresh=False, transient=False) as live:
            live.refresh()
            while True:
                time.sleep(interval)
                new = read()
                if new != text:
                    text = new
                    live.update(text, refresh=True)
    last = ""
    while True:
        plain = read().plain + "\n"
        if plain != last:
            stamp = time.strftime("%H:%M:%S", time.gmtime())
            out.write(f"--- {stamp} UTC\n{plain}")
            out.flush()
            last = plain
        time.sleep(interval)
