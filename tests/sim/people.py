"""Who asks, in the simulation: people's writes go through the shipped admission stamp.

Every write a simulated person makes to a ClusterVersion or an UpdateRun (its spec, its people
annotations) is an AdmissionRequest given to the product's mutating webhook
(`orchestrator.adapters.webhook.stamp`) when the webhook sees it, as the apiserver would; the
orchestrator's own writes (the ClusterVersion handing its requests to its run, a consumed
annotation, a stop) go through it as the orchestrator's trusted service account. The run's
requester is then what `orchestrator.engine.requester.requester` makes of the stored object, as
the UpdateRun controller computes it. The cast is drawn per history: one authenticated person,
several, or a mix with writers the webhook never saw (it is down: failurePolicy Ignore) and one
who types someone else's name into the stamp annotation by hand.

The ground truth (who wrote each object, and whether the webhook saw it) is kept here, apart
from the annotations, for the invariant "who asked" (tests/sim/invariants.py).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator import api
from orchestrator.adapters.webhook import stamp
from orchestrator.engine.requester import UNAUTHENTICATED, requester
from tests.sim.model import RunObj

__all__ = [
    "CASTS",
    "SERVICE_ACCOUNT",
    "SETS",
    "People",
    "Person",
    "admit",
    "run_annotations",
    "run_requester",
]

#: The orchestrator's service account: the webhook trusts it to hand a user over.
SERVICE_ACCOUNT = "system:serviceaccount:fleet-upgrade-system:fleet-orchestrator"
TRUSTED = frozenset({SERVICE_ACCOUNT})
#: A run's annotations the model keeps as sets (RunObj.retry, skip, skip_stages).
SETS = (
    api.ANNOTATION_RETRY_CLUSTERS,
    api.ANNOTATION_SKIP_CLUSTERS,
    api.ANNOTATION_SKIP_STAGES,
)


@dataclass(frozen=True)
class Person:
    """Someone who writes our objects with kubectl."""

    #: The user the apiserver authenticates.
    name: str
    #: What they type as requested-by (a display name only).
    typed: str
    #: Whether the admission webhook sees their writes (False: it is down).
    seen: bool = True
    #: A requested-by-user they type by hand (never to be believed).
    forged: str = ""

    def annotations(self) -> dict[str, str]:
        """What the person types on every request."""
        out = {api.ANNOTATION_REQUESTED_BY: self.typed, api.ANNOTATION_REASON: "simulated"}
        if self.forged:
            out[api.ANNOTATION_REQUESTED_BY_USER] = self.forged
        return out


#: The casts a history draws from.
CASTS: tuple[tuple[Person, ...], ...] = (
    (Person("alice", "alice@example.com"),),
    (Person("alice", "alice"), Person("bob", "Bob B.")),
    (
        Person("alice", "alice"),
        Person("carol", "carol@ops", seen=False),
        Person("mallory", "mallory", seen=False, forged="cto"),
    ),
)


def admit(
    kind: str,
    before: tuple[Mapping[str, str], Any] | None,
    after: tuple[Mapping[str, str], Any],
    user: str | None,
) -> dict[str, str]:
    """The annotations stored after one write (annotations, spec JSON), as the apiserver stores
    them: with the webhook's patch applied, unless the webhook did not see it (user None)."""
    annotations = dict(after[0])
    if user is None:
        return annotations
    request: dict[str, Any] = {
        "operation": "CREATE" if before is None else "UPDATE",
        "kind": {"kind": kind},
        "userInfo": {"username": user, "groups": ["system:authenticated", "team"]},
        "object": {"metadata": {"annotations": annotations}, "spec": after[1]},
    }
    if before is not None:
        request["oldObject"] = {"metadata": {"annotations": dict(before[0])}, "spec": before[1]}
    for op in stamp(request, TRUSTED):
        path = op["path"]
        if path == "/metadata/annotations":
            annotations = dict(op["value"])
            continue
        key = path.removeprefix("/metadata/annotations/").replace("~1", "/").replace("~0", "~")
        if op["op"] == "remove":
            annotations.pop(key, None)
        else:
            annotations[key] = op["value"]
    return annotations


def run_annotations(obj: RunObj) -> dict[str, str]:
    """A run's metadata.annotations as stored: the model's sets written out as the
    comma-separated annotations they stand for."""
    out = dict(obj.annotations)
    for key, values in zip(SETS, (obj.retry, obj.skip, obj.skip_stages), strict=True):
        if values:
            out[key] = ",".join(sorted(values))
    return out


def run_requester(obj: RunObj) -> str:
    """Who asked, as the UpdateRun controller records it: orchestrator.engine.requester on the
    run's annotations and spec as stored."""
    return requester(run_annotations(obj), obj.spec.dump())


@dataclass
class People:
    """The history's cast, and the ground truth of who asked."""

    seed: int
    cast: tuple[Person, ...] = ()
    #: object key (a run's or a ClusterVersion's) → everyone whose request reached it.
    wrote: dict[str, set[Person]] = field(default_factory=dict)
    #: object key → the person whose request its stamp stands for now: the last to change its
    #: spec or people annotations, or for a run the ClusterVersion's when it handed requests over.
    asker: dict[str, Person] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed * 8861 + 17)
        self.cast = self.rng.choice(CASTS)

    def pick(self) -> Person:
        return self.rng.choice(self.cast)

    @staticmethod
    def user(person: Person | None) -> str | None:
        """The user the webhook sees write (None: it does not see the write): a person's
        authenticated name, or the orchestrator's service account (person None)."""
        if person is None:
            return SERVICE_ACCOUNT
        return person.name if person.seen else None

    def record(self, key: str, person: Person) -> None:
        """person changed the object's spec or people annotations."""
        self.wrote.setdefault(key, set()).add(person)
        self.asker[key] = person

    def hand(self, cv: str, run: str) -> None:
        """The ClusterVersion handed requests to its run (engine.requester.handover)."""
        self.wrote.setdefault(run, set()).update(self.wrote.get(cv, set()))
        if cv in self.asker:
            self.asker[run] = self.asker[cv]

    def check(self, run: str, who: str) -> str | None:
        """What is wrong with recording `who` ("user" or "user (as typed)") for a request to
        run, if anything. A user is recorded only for the person whose request the run's stamp
        stands for, and only when the webhook saw that write: never a name typed by hand, never
        another person (a ClusterVersion's writer for a request made on the run itself).
        "unauthenticated" is the safe answer, except when one authenticated person wrote all of
        it: then it is that person (a stamp lost on the way: a hand-over, a consumed
        annotation, a stop, would read "unauthenticated")."""
        user = who.split(" (as ", 1)[0]
        asker = self.asker.get(run)
        if user != UNAUTHENTICATED and (asker is None or not asker.seen or user != asker.name):
            asked = "nobody" if asker is None else f"{asker.name} (seen: {asker.seen})"
            return f"{who!r} recorded, but the request on record for {run} is by {asked}"
        writers = self.wrote.get(run, set())
        if len(writers) == 1 and all(p.seen for p in writers):
            (p,) = writers
            want = p.name if p.typed == p.name else f"{p.name} (as {p.typed})"
            if who != want:
                return f"{who!r} recorded for {run}, which only {p.name} wrote: expected {want!r}"
        return None
