"""Operator verbs of fleet-orchestrator (status, history, approve, retry, skip, stop, resume).

They talk to the apiserver like kubectl, through orchestrator.adapters.kube.KubeClient, and only
read objects or write the annotations and spec fields the controllers act on.

Rooms: `read` (the read model), `render` (what is printed), `verbs` (the writes),
`commands` (the command line). This package re-exports what the CLI and the docs use.
"""

from orchestrator.operate.commands import COMMANDS, add_commands, run
from orchestrator.operate.read import (
    ClusterLine,
    OperateError,
    Snapshot,
    StageLine,
    UpgradeCache,
    snapshot,
)
from orchestrator.operate.render import bar, render, render_history, renderable
from orchestrator.operate.verbs import Request

__all__ = [
    "COMMANDS",
    "ClusterLine",
    "OperateError",
    "Request",
    "Snapshot",
    "StageLine",
    "UpgradeCache",
    "add_commands",
    "bar",
    "render",
    "render_history",
    "renderable",
    "run",
    "snapshot",
]
