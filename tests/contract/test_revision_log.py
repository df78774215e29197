"""plugins.sdk.RevisionLog: the inventory's revisions a plugin that lists what changed keeps
(ListClusters changed_since; docs/plugin-contract.md). The sim plugin and the echo reference
plugin list through it; tests/contract/test_inventory_rows.py and the conformance kit check
them end to end, this checks the log's own promises against a brute-force model."""

from __future__ import annotations

import random

from plugins.sdk import RevisionLog


def test_changes_since_a_revision_are_every_cluster_touched_after_it_once_sorted() -> None:
    rng = random.Random(7)
    log = RevisionLog()
    history: list[tuple[str, str]] = []  # (revision before the touch, cluster id)
    for _ in range(500):
        cid = f"c{rng.randrange(40):02d}"
        history.append((log.revision, cid))
        log.touch(cid)
    for at in range(0, 500, 17):
        revision = history[at][0]
        expected = sorted({cid for _, cid in history[at:]})
        assert log.changed_since(revision) == expected
    assert log.changed_since(log.revision) == []


def test_a_revision_it_cannot_answer_since_asks_for_every_cluster() -> None:
    log = RevisionLog()
    log.touch("a")
    other = RevisionLog()  # another process (a restarted plugin): another epoch
    other.touch("a")
    assert other.epoch != log.epoch
    assert log.changed_since(other.revision) is None
    assert log.changed_since(f"{log.epoch}:99") is None  # one it never gave
    assert log.changed_since(f"{log.epoch}:-1") is None
    assert log.changed_since("garbage") is None
    assert log.changed_since("") is None
    assert log.changed_since(f"{log.epoch}:0") == ["a"]
