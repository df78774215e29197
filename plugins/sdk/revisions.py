"""The inventory's revisions, for a plugin that lists what changed (`ListsChanges`).

ListClustersResponse.revision names the inventory as one listing saw it; a later
ListClustersRequest.changed_since asks for the clusters changed since then (docs/
plugin-contract.md, "The inventory's changes"). `RevisionLog` keeps what that takes: a
revision counted up on every change of a cluster's answer, each cluster's last change, and
this process's epoch, so that a revision another process (or an earlier run of this one)
gave is never answered as if it were ours: a restarted plugin lists every cluster.

It keeps one entry per cluster, however often it changes, in the order of their last change,
so listing the changes since a revision costs the clusters changed since then. It takes no
lock: call it under the lock that guards the plugin's inventory, the one its answers are read
under, so that a listing and its revision agree.
"""

from __future__ import annotations

import secrets

__all__ = ["RevisionLog"]


class RevisionLog:
    """A plugin's inventory revisions: `touch` on every change of a cluster's answer;
    `revision` for a listing's response; `changed_since` for a request's changed_since."""

    def __init__(self) -> None:
        #: This process's epoch: a revision of another names another epoch.
        self.epoch = secrets.token_hex(4)
        self._number = 0
        #: Cluster id → the revision of its last change, oldest first (a change moves it last).
        self._last: dict[str, int] = {}

    @property
    def revision(self) -> str:
        """The inventory's revision now ("epoch:number"), for ListClustersResponse.revision."""
        return f"{self.epoch}:{self._number}"

    def touch(self, cluster_id: str) -> None:
        """A cluster's answer changed (it came, changed or left): the next revision counts it."""
        self._number += 1
        self._last.pop(cluster_id, None)
        self._last[cluster_id] = self._number

    def changed_since(self, revision: str) -> list[str] | None:
        """The ids of the clusters changed since `revision`, sorted; None when it is not a
        revision this log can answer since (another epoch's, malformed, or one it never
        gave): then the whole inventory is the answer, changes_only false."""
        epoch, _, number = revision.partition(":")
        if epoch != self.epoch or not number.isdigit() or int(number) > self._number:
            return None
        since = int(number)
        changed: list[str] = []
        for cluster_id, last in reversed(self._last.items()):
            if last <= since:
                break
            changed.append(cluster_id)
        changed.sort()
        return changed
