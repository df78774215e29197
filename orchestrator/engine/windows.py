"""Maintenance windows: whether one cluster may start its upgrade now, and if not, when (pure).

No I/O and no wall clock: the caller passes `now`. The engine asks `gate()` once per cluster it
considers admitting; `maintenance_problems()` is the admission-time validation of the same spec.

Semantics of `gate(maintenance, provider, now, not_before=, minor=)`, with D the maintenance's
expectedDuration (D = 0 when allowOverrun is true):

- No maintenance (and so no honoured provider windows): a cluster may always start (notBefore
  still applies).
- notBefore: nothing starts before it.
- The run's (or stage's) windows: each occurrence opens at `start` (HH:MM local wall time in
  `timeZone`) on the days listed (`days`), on the dates an RFC 5545 `rrule` yields, or every day
  when neither is set, and stays open for `duration` of elapsed time. Local times follow RFC
  5545 section 3.3.5: a start inside a DST gap (spring forward) is read with the offset before
  the gap (02:30 in Europe/Berlin on the last Sunday of March opens at 03:30 CEST); a start that
  occurs twice (fall back) is the first of the two. Occurrences that overlap or touch form one
  open span. A start at t needs [t, t + D] inside one open span (with allowOverrun: t inside
  one). Unset or empty `windows`: always open. An rrule counts from its DTSTART line's date
  ("DTSTART:20261107\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=SA"), else from RRULE_ANCHOR; its
  time of day is always `start` (no BYHOUR/BYMINUTE/BYSECOND; daily or longer; UNTIL in UTC).
- The run's exclusions [start, end): a start at t is refused when t is inside one, or (without
  allowOverrun) when one begins before t + D; a start that would end exactly when an exclusion
  begins is allowed.
- The provider's windows (`providerWindows`): Off ignores them. Windows: when the cluster
  reports any window, [t, t + D] must also lie inside one of its occurrences (the intersection
  with the run's windows). WindowsAndExclusions: also the cluster's exclusions, refusing like the
  run's own, where the scope applies: NO_UPGRADES and NO_MINOR_OR_NODE_UPGRADES always (node
  pools are always upgraded), NO_MINOR_UPGRADES only for a minor upgrade (`minor`), an empty or
  unknown scope always. A provider window recurs by its RRULE from its first start (its first
  end - first start long each time).
- `next_start`: the earliest t >= now at which the gate would open, exact to the microsecond
  (a window's opening, an exclusion's end, notBefore or now itself), searched over HORIZON (400
  days); None when nothing opens within it, or when the spec cannot be read (the reason says
  which field and the fix).

Cost: the engine calls this for every cluster of a decision with mostly identical inputs.
Schedules are compiled per maintenance spec (keyed on its JSON, remembered per model object),
per honoured provider window tuple and per UTC day (a week ahead first, 400 days only when
nothing opens within the week); whole answers are cached per (spec, provider windows, now,
notBefore), and a closed answer's next start is reused by later decisions until it comes.
`python -m benchmarks.bench_windows` prints µs per call at 10,000 clusters.
"""

from __future__ import annotations

import functools
import math
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from dateutil.rrule import rrule, rrulestr

from orchestrator import api
from orchestrator.engine.memo import BoundedMemo
from orchestrator.engine.observations import WindowObs

__all__ = [
    "HORIZON",
    "RRULE_ANCHOR",
    "Gate",
    "Recurrence",
    "gate",
    "maintenance_problems",
    "parse_recurrence",
    "parse_time",
    "time_zone",
]

#: How far ahead next_start is searched.
HORIZON = timedelta(days=400)
#: The first, cheap search span; the full HORIZON is expanded only when nothing opens sooner.
_SHORT = timedelta(days=7)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_DAY_US = 86_400_000_000
#: Longest window and expected duration accepted.
_LONGEST = timedelta(days=366)
#: A run window's rrule without DTSTART counts from this date (a Saturday, the 1st of January):
#: FREQ=MONTHLY alone opens on the 1st, FREQ=WEEKLY alone on Saturdays, INTERVAL=2 from here.
RRULE_ANCHOR = date(2000, 1, 1)
_WEEKDAYS = {day: i for i, day in enumerate(api.Weekday)}
_FREQS = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY")
_LOCAL_FREQS = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY")
_SUB_DAILY_SECONDS = {"HOURLY": 3600, "MINUTELY": 60, "SECONDLY": 1}
#: GKE exclusion scopes (google.container.v1 MaintenanceExclusionOptions.Scope) that leave
#: upgrades other than minor ones through; every other scope excludes all we do.
_MINOR_ONLY_SCOPES = frozenset({"NO_MINOR_UPGRADES"})
_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_UNTIL = re.compile(r"^(\d{8})T(\d{6})Z$")
_DTSTART = re.compile(r"^DTSTART(?:;[^:]*)?:(\d{8})(?:T\d{6}Z?)?$")


@dataclass(frozen=True)
class Gate:
    """Whether a cluster may start its upgrade now; if not, when it may and why it waits."""

    may_start: bool
    #: Earliest time it may start (== now when may_start; None: nothing within HORIZON).
    next_start: datetime | None
    #: Names the window / exclusion / notBefore and the times; "" when may_start.
    reason: str


# -- parsing (shared with the admission-time validation) ----------------------------------------


def parse_time(text: str) -> datetime:
    """An RFC 3339 time (e.g. 2026-12-20T00:00:00Z) as an aware datetime."""
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time; write it like 2026-12-20T00:00:00Z")
    day, clock, fraction, offset = match.groups()
    fraction = (fraction or "")[:7]  # datetime keeps microseconds
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        return datetime.fromisoformat(f"{day}T{clock}{fraction}{offset}")
    except ValueError as err:
        raise ValueError(f"{text!r} is not a valid time ({err})") from None


def time_zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`."""
    try:
        return ZoneInfo(name)
    except Exception:  # ZoneInfoNotFoundError, ValueError, IsADirectoryError, ...
        raise ValueError(
            f'"{name}" is not an IANA time zone; use one such as Europe/Berlin'
        ) from None


@dataclass(frozen=True)
class Recurrence:
    """An RRULE as read once: dateutil's text without COUNT and UNTIL, which are applied here."""

    freq: str
    interval: int
    count: int | None
    until: datetime | None
    #: The DTSTART date given with the rule, if any.
    anchor: date | None
    body: str


def parse_recurrence(text: str, *, local: bool) -> Recurrence:
    """Read an RFC 5545 RRULE ("FREQ=...;...", optionally "RRULE:"-prefixed, optionally after a
    "DTSTART:YYYYMMDD" line). `local`: a run window's rule, whose occurrences open at the
    window's start time: daily or longer, no BYHOUR / BYMINUTE / BYSECOND."""
    body = ""
    anchor = None
    for raw in re.split(r"[\r\n]+", text.strip()):
        line = raw.strip()
        upper = line.upper()
        if not line:
            continue
        if upper.startswith("DTSTART"):
            match = _DTSTART.match(upper)
            if match is None:
                raise ValueError(f"{line!r} is not a DTSTART such as DTSTART:20260103")
            anchor = _yyyymmdd(match.group(1))
        elif upper.startswith("RRULE:") or ("=" in line and ":" not in line):
            if body:
                raise ValueError("has more than one RRULE; use one rule per window")
            body = line.split(":", 1)[1] if upper.startswith("RRULE:") else line
        else:
            raise ValueError(f"{line!r} is not an RRULE; write it like FREQ=WEEKLY;BYDAY=SA,SU")
    if not body:
        raise ValueError("has no RRULE; write it like FREQ=WEEKLY;BYDAY=SA,SU")
    parts: dict[str, str] = {}
    for part in body.split(";"):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{part!r} is not NAME=VALUE; write it like FREQ=WEEKLY;BYDAY=SA,SU")
        parts[key.strip().upper()] = value.strip().upper()
    freq = parts.get("FREQ", "")
    allowed = _LOCAL_FREQS if local else _FREQS
    if freq not in allowed:
        raise ValueError(f"FREQ must be one of {', '.join(allowed)} (got {freq or 'none'})")
    if local:
        for key in ("BYHOUR", "BYMINUTE", "BYSECOND"):
            if key in parts:
                raise ValueError(f"{key} is not allowed: the window's start sets the time of day")
    try:
        interval = int(parts.get("INTERVAL", "1"))
        count = int(parts["COUNT"]) if "COUNT" in parts else None
    except ValueError:
        raise ValueError("INTERVAL and COUNT must be whole numbers") from None
    if interval < 1 or (count is not None and count < 1):
        raise ValueError("INTERVAL and COUNT must be at least 1")
    until = None
    if "UNTIL" in parts:
        if count is not None:
            raise ValueError("UNTIL and COUNT must not both be set")
        match = _UNTIL.match(parts["UNTIL"])
        if match is None:
            raise ValueError(f"UNTIL {parts['UNTIL']} must be a UTC time such as 20261231T235959Z")
        until = datetime.strptime("".join(match.groups()), "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    kept = ";".join(f"{k}={v}" for k, v in parts.items() if k not in ("COUNT", "UNTIL"))
    rec = Recurrence(freq, interval, count, until, anchor, kept)
    try:  # let dateutil judge the rest (BYDAY=XX, BYMONTH=13, ...)
        rrulestr(kept, dtstart=datetime(2000, 1, 1, tzinfo=UTC))
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"is not a valid RRULE ({err})") from None
    return rec


def _yyyymmdd(text: str) -> date:
    try:
        return date(int(text[:4]), int(text[4:6]), int(text[6:8]))
    except ValueError:
        raise ValueError(f"{text} is not a date (YYYYMMDD)") from None


# -- expansion ----------------------------------------------------------------------------------


def _us(moment: datetime) -> int:
    """Microseconds since the epoch (exact)."""
    return (moment - _EPOCH) // _US


def _dt(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _iso(us: int) -> str:
    moment = _dt(us)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}"
    return text + "Z"


def _shifted(rec: Recurrence, first: datetime, lo: datetime) -> datetime:
    """A DTSTART at or before lo, a whole number of rule periods after first, so expanding from
    it yields the same occurrences from lo on as expanding from first (COUNT-free rules)."""
    if lo <= first:
        return first
    if rec.freq in ("DAILY", "WEEKLY"):
        step = rec.interval * (7 if rec.freq == "WEEKLY" else 1)
        days = (lo.astimezone(first.tzinfo).date() - first.date()).days
        k = max(0, days // step - 1)
        return datetime.combine(first.date() + timedelta(days=k * step), first.timetz())
    if rec.freq in ("MONTHLY", "YEARLY"):
        if first.month == 2 and first.day == 29:
            return first
        years = math.lcm(rec.interval, 12) // 12 if rec.freq == "MONTHLY" else rec.interval
        k = max(0, (lo.year - first.year) // years - 1)
        return first.replace(year=first.year + k * years)
    step_s = rec.interval * _SUB_DAILY_SECONDS[rec.freq]
    k = max(0, int((lo - first).total_seconds()) // step_s - 1)
    return (first.astimezone(UTC) + timedelta(seconds=k * step_s)).astimezone(first.tzinfo)


def _rule(body: str, dtstart: datetime) -> rrule:
    rule = rrulestr(body, dtstart=dtstart)
    if not isinstance(rule, rrule):  # one RRULE line never makes a set
        raise ValueError("is not a single RRULE")
    return rule


def _occurrences(rec: Recurrence, first: datetime, lo: datetime, hi: datetime) -> list[datetime]:
    """Starts of the rule's occurrences in [lo, hi], counting from first."""
    base = first if rec.count is not None else _shifted(rec, first, lo)
    until = hi if rec.until is None else min(hi, rec.until)
    if until < base:
        return []
    rule = _rule(rec.body, base).replace(until=until)
    out = []
    for n, moment in enumerate(rule, start=1):
        if rec.count is not None and n > rec.count:
            break
        if moment >= lo:
            out.append(moment)
    return out


Span = tuple[int, int, str]  # start µs, end µs, label


def _merged(spans: list[Span]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """Overlapping or touching spans joined: starts, ends and labels, in order."""
    starts: list[int] = []
    ends: list[int] = []
    labels: list[str] = []
    for start, end, label in sorted(spans):
        if end <= start:
            continue
        if ends and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
            if label not in labels[-1].split(", "):
                labels[-1] += f", {label}"
        else:
            starts.append(start)
            ends.append(end)
            labels.append(label)
    return tuple(starts), tuple(ends), tuple(labels)


# -- the compiled spec --------------------------------------------------------------------------


@dataclass(frozen=True)
class _RunWindow:
    label: str
    zone: ZoneInfo
    hour: int
    minute: int
    length: timedelta
    days: frozenset[int] | None
    rule: Recurrence | None

    def spans(self, lo_us: int, hi_us: int) -> list[Span]:
        length_us = self.length // _US
        lo, hi = _dt(lo_us - length_us), _dt(hi_us)
        if self.rule is not None:
            first_day = self.rule.anchor or RRULE_ANCHOR
            first = datetime(
                first_day.year,
                first_day.month,
                first_day.day,
                self.hour,
                self.minute,
                tzinfo=self.zone,
            )
            starts = [_us(s) for s in _occurrences(self.rule, first, lo, hi)]
        else:
            starts = []
            day = lo.astimezone(self.zone).date() - timedelta(days=1)
            last = hi.astimezone(self.zone).date() + timedelta(days=1)
            while day <= last:
                if self.days is None or day.weekday() in self.days:
                    opens = datetime(
                        day.year, day.month, day.day, self.hour, self.minute, tzinfo=self.zone
                    )
                    starts.append(_us(opens))
                day += timedelta(days=1)
        return [
            (s, s + length_us, self.label) for s in starts if s < hi_us and s + length_us > lo_us
        ]


@dataclass(frozen=True)
class _Plan:
    """A maintenance spec read once: windows (None: always open), exclusions, the rule for D."""

    windows: tuple[_RunWindow, ...] | None
    window_names: str
    exclusions: tuple[Span, ...]
    provider: api.ProviderWindows
    expected: str
    expected_us: int
    overrun: bool
    lookback_us: int
    error: str = ""

    @property
    def d_us(self) -> int:
        """The time a start needs free ahead of it: 0 with allowOverrun."""
        return 0 if self.overrun else self.expected_us


def _label(name: str | None, where: str) -> str:
    return f"'{name}'" if name else where


def _compile(m: api.Maintenance) -> _Plan:
    """Read a spec; a field that cannot be read leaves `error` (field and fix) set."""
    errors = [f"maintenance.{field}: {message}" for field, message in _read_problems("", m)]
    expected = _duration(m.expected_duration) or timedelta(0)
    windows: list[_RunWindow] = []
    lookback = timedelta(days=1)
    for i, w in enumerate(m.windows or []):
        try:
            zone = time_zone(w.time_zone)
            rule = parse_recurrence(w.rrule, local=True) if w.rrule is not None else None
            length = api.parse_duration(w.duration)
        except ValueError:
            continue  # already in errors
        hour, minute = (int(p) for p in w.start.split(":"))
        days = None if w.days is None else frozenset(_WEEKDAYS[d] for d in w.days)
        windows.append(
            _RunWindow(_label(w.name, f"windows[{i}]"), zone, hour, minute, length, days, rule)
        )
        lookback = max(lookback, length + timedelta(days=1))
    exclusions: list[Span] = []
    for i, x in enumerate(m.exclusions or []):
        try:
            exclusions.append(
                (
                    _us(parse_time(x.start)),
                    _us(parse_time(x.end)),
                    _label(x.name, f"exclusions[{i}]"),
                )
            )
        except ValueError:
            continue
    names = ", ".join(w.label for w in windows)
    return _Plan(
        windows=tuple(windows) if m.windows else None,
        window_names=names,
        exclusions=tuple(exclusions),
        provider=m.provider_windows,
        expected=m.expected_duration,
        expected_us=expected // _US,
        overrun=m.allow_overrun,
        lookback_us=lookback // _US,
        error="; ".join(errors),
    )


def _duration(text: str) -> timedelta | None:
    try:
        return api.parse_duration(text)
    except ValueError:
        return None


@functools.lru_cache(maxsize=256)
def _plan_of_json(key: str) -> _Plan:
    return _compile(api.Maintenance.model_validate_json(key))


_BY_ID: BoundedMemo[int, tuple[api.Maintenance, str]] = BoundedMemo(256)


def _key(m: api.Maintenance) -> str:
    """The spec's JSON (the cache key); remembered per object, as models are frozen."""
    hit = _BY_ID.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    key = m.model_dump_json(by_alias=True)
    _BY_ID.put(id(m), (m, key))  # the strong reference keeps id(m) from being reused
    return key


# -- schedules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cover:
    """Merged open spans: a start at t needs one of them to contain [t, t + D]."""

    starts: Sequence[int]  # array('q'): 8 bytes a time, as a 400-day schedule is cached
    ends: Sequence[int]
    labels: tuple[str, ...]

    def at(self, t: int) -> int:
        """Index of the span with the last start <= t, or -1."""
        return bisect_right(self.starts, t) - 1

    def allows(self, t: int, d: int) -> bool:
        i = self.at(t)
        return i >= 0 and (t + d <= self.ends[i] if d else t < self.ends[i])


def _cover(spans: list[Span]) -> _Cover:
    starts, ends, labels = _merged(spans)
    return _Cover(array("q", starts), array("q", ends), labels)


def _bounds(bucket: int, span: timedelta, plan: _Plan) -> tuple[int, int]:
    """The µs range a schedule of this UTC day needs: lookback before, span + D after."""
    lo = bucket * _DAY_US - plan.lookback_us
    hi = (bucket + 1) * _DAY_US + span // _US + plan.expected_us
    return lo, hi


@functools.lru_cache(maxsize=512)
def _run_cover(key: str, bucket: int, span: timedelta) -> _Cover:
    plan = _plan_of_json(key)
    lo, hi = _bounds(bucket, span, plan)
    spans: list[Span] = []
    for window in plan.windows or ():
        spans += window.spans(lo, hi)
    return _cover(spans)


@dataclass(frozen=True)
class _Provider:
    """The provider's windows and honoured exclusions of one cluster, expanded for one day."""

    cover: _Cover | None  # None: it reports no window
    exclusions: tuple[Span, ...]
    error: str


def _provider_spans(w: WindowObs, lo_us: int, hi_us: int) -> list[Span]:
    length = w.end - w.start
    words = [f"'{w.name}'"] if w.name else []
    if w.kind == "exclusion" and w.scope:
        words.append(f"(scope {w.scope})")
    label = " ".join(words)
    if not w.recurrence:
        starts = [w.start]
    else:
        rec = parse_recurrence(w.recurrence, local=False)
        since = _dt(lo_us)  # occurrences that began up to one length earlier are still open
        first = w.start if length >= since - w.start else since - length
        starts = _occurrences(rec, w.start, first, _dt(hi_us))
    spans = [(_us(s), _us(s + length), label) for s in starts]
    return [sp for sp in spans if sp[0] < hi_us and sp[1] > lo_us]


def _provider(
    windows: tuple[WindowObs, ...],
    exclusions: tuple[WindowObs, ...],
    bucket: int,
    span: timedelta,
    expected_us: int,
) -> _Provider:
    """The provider's schedule: short spans cached for many clusters, full horizons for fewer
    (they are only needed while nothing opens within a week)."""
    cached = _provider_short if span is _SHORT else _provider_long
    return cached(windows, exclusions, bucket, span, expected_us)


def _provider_expanded(
    windows: tuple[WindowObs, ...],
    exclusions: tuple[WindowObs, ...],
    bucket: int,
    span: timedelta,
    expected_us: int,
) -> _Provider:
    lo = (bucket - 1) * _DAY_US
    hi = (bucket + 1) * _DAY_US + span // _US + expected_us
    try:
        cover_spans: list[Span] = []
        for w in windows:
            cover_spans += _provider_spans(w, lo, hi)
        excluded: list[Span] = []
        for w in exclusions:
            excluded += _provider_spans(w, lo, hi)
    except (ValueError, OverflowError) as err:
        return _Provider(None, (), str(err))
    return _Provider(_cover(cover_spans) if windows else None, tuple(excluded), "")


_provider_short = functools.lru_cache(maxsize=8192)(_provider_expanded)
_provider_long = functools.lru_cache(maxsize=1024)(_provider_expanded)


@functools.lru_cache(maxsize=4096)
def _honoured(
    provider: tuple[WindowObs, ...], policy: api.ProviderWindows, minor: bool
) -> tuple[tuple[WindowObs, ...], tuple[WindowObs, ...]]:
    """The provider windows and exclusions the policy honours (for this kind of upgrade)."""
    if policy is api.ProviderWindows.OFF:
        return (), ()
    windows = tuple(w for w in provider if w.kind == "window" and w.end > w.start)
    if policy is not api.ProviderWindows.WINDOWS_AND_EXCLUSIONS:
        return windows, ()
    exclusions = tuple(
        w
        for w in provider
        if w.kind == "exclusion"
        and w.end > w.start
        and (minor or w.scope.upper() not in _MINOR_ONLY_SCOPES)
    )
    return windows, exclusions


@dataclass(frozen=True)
class _Blocked:
    """Merged times at which a start is refused because of an exclusion: (a, b) open when
    D > 0 (it would run into one), [a, b) when D = 0."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    d: int

    def blocks(self, t: int) -> bool:
        i = (bisect_left(self.starts, t) if self.d else bisect_right(self.starts, t)) - 1
        return i >= 0 and t < self.ends[i]


def _blocked(exclusions: Sequence[Span], d: int) -> _Blocked:
    starts: list[int] = []
    ends: list[int] = []
    for a, b, _ in sorted((a - d, b, label) for a, b, label in exclusions):
        if ends and (a < ends[-1] if d else a <= ends[-1]):
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return _Blocked(tuple(starts), tuple(ends), d)


# -- the gate -----------------------------------------------------------------------------------


def gate(
    maintenance: api.Maintenance | None,
    provider: Sequence[WindowObs],
    now: datetime,
    *,
    not_before: datetime | None = None,
    minor: bool = True,
) -> Gate:
    """Whether a cluster may start its upgrade at `now` (aware), per the module's semantics."""
    if now.tzinfo is None or (not_before is not None and not_before.tzinfo is None):
        raise ValueError("gate: now and not_before must be aware datetimes")
    now_us = _us(now)
    nb_us = _us(not_before) if not_before is not None else None
    if maintenance is None:
        if nb_us is None or nb_us <= now_us:
            return Gate(True, now, "")
        return Gate(False, _dt(nb_us), f"notBefore {_iso(nb_us)} has not come yet")
    key = _key(maintenance)
    plan = _plan_of_json(key)
    windows, exclusions = _honoured(
        provider if isinstance(provider, tuple) else tuple(provider), plan.provider, minor
    )
    answer = _gate(key, windows, exclusions, now_us, nb_us)
    if answer.may_start:
        return Gate(True, now, "")
    return answer


#: What an earlier call learnt per input: (from, clear until, next start or None): nothing is
#: allowed in [from, clear until), and the next start is clear until (or, when None, nothing was
#: found up to there: only the new stretch of a later now's horizon needs a look). Later
#: decisions (a new `now`) thus skip the search until the next start comes.
_CLOSED: BoundedMemo[tuple[object, ...], tuple[int, int, int | None]] = BoundedMemo(16384)


@dataclass(frozen=True)
class _Schedule:
    run: _Cover | None
    prov: _Provider
    blocked: _Blocked

    def allows(self, t: int, d: int, nb: int | None) -> bool:
        return (
            (nb is None or t >= nb)
            and (self.run is None or self.run.allows(t, d))
            and (self.prov.cover is None or self.prov.cover.allows(t, d))
            and not self.blocked.blocks(t)
        )

    def candidates(self, nb: int | None) -> set[int]:
        """Every left end of an allowed stretch: openings, exclusion ends, notBefore."""
        found = set(self.blocked.ends)
        for cover in (self.run, self.prov.cover):
            if cover is not None:
                found.update(cover.starts)
        if nb is not None:
            found.add(nb)
        return found


def _schedule(
    plan: _Plan,
    key: str,
    windows: tuple[WindowObs, ...],
    exclusions: tuple[WindowObs, ...],
    bucket: int,
    span: timedelta,
) -> _Schedule:
    run = _run_cover(key, bucket, span) if plan.windows is not None else None
    prov = _provider(windows, exclusions, bucket, span, plan.expected_us)
    return _Schedule(run, prov, _blocked((*plan.exclusions, *prov.exclusions), plan.d_us))


@functools.lru_cache(maxsize=16384)
def _gate(
    key: str,
    windows: tuple[WindowObs, ...],
    exclusions: tuple[WindowObs, ...],
    now_us: int,
    nb_us: int | None,
) -> Gate:
    plan = _plan_of_json(key)
    if plan.error:
        return Gate(False, None, f"the maintenance spec cannot be honoured: {plan.error}")
    d = plan.d_us
    bucket = now_us // _DAY_US
    memo = (key, windows, exclusions, nb_us)
    known = _CLOSED.get(memo)
    spans: tuple[timedelta, ...] = (_SHORT, HORIZON)
    after = now_us  # candidates strictly after this are searched
    if known is not None and known[0] <= now_us < known[1]:
        if known[2] is not None:  # the same next start; the reason is now's
            near = _schedule(plan, key, windows, exclusions, bucket, _SHORT)
            if near.prov.error:
                return _unreadable(near.prov.error)
            return Gate(False, _dt(known[2]), _why(plan, near, now_us, nb_us))
        spans, after = (HORIZON,), known[1] - 1
    for span in spans:
        limit = now_us + span // _US
        sched = _schedule(plan, key, windows, exclusions, bucket, span)
        if sched.prov.error:
            return _unreadable(sched.prov.error)
        if after == now_us and sched.allows(now_us, d, nb_us):
            return Gate(True, _dt(now_us), "")
        ahead = sorted(t for t in sched.candidates(nb_us) if after < t <= limit)
        found = next((t for t in ahead if sched.allows(t, d, nb_us)), None)
        if found is not None:
            _CLOSED.put(
                memo, (now_us if known is None or after == now_us else known[0], found, found)
            )
            return Gate(False, _dt(found), _why(plan, sched, now_us, nb_us))
        if span is HORIZON:
            start = now_us if known is None or after == now_us else known[0]
            _CLOSED.put(memo, (start, limit + 1, None))
            why = _why(plan, sched, now_us, nb_us)
            return Gate(False, None, f"{why}; nothing opens within {HORIZON.days} days")
    raise AssertionError("unreachable")  # pragma: no cover


def _unreadable(error: str) -> Gate:
    return Gate(
        False,
        None,
        f"the provider reports a maintenance window that cannot be read ({error}); "
        "set maintenance.providerWindows: Off to ignore the provider's windows",
    )


def _why(plan: _Plan, sched: _Schedule, now: int, nb: int | None) -> str:
    """What refuses a start at now, in words (every reason that applies)."""
    d = plan.d_us
    take = f"an upgrade expected to take {plan.expected} would finish"
    parts = []
    if nb is not None and now < nb:
        parts.append(f"notBefore {_iso(nb)} has not come yet")

    def excluded(spans: Sequence[Span], whose: str) -> None:
        for a, b, label in sorted(spans):
            named = f" {label}" if label else ""
            if a <= now < b:
                parts.append(f"inside {whose}maintenance exclusion{named} until {_iso(b)}")
            elif d and now < a < now + d:
                parts.append(
                    f"{whose}maintenance exclusion{named} starts at {_iso(a)}, before {take}"
                )

    def outside(cover: _Cover, whose: str, closed: str) -> None:
        if cover.allows(now, d):
            return
        i = cover.at(now)
        if i >= 0 and now < cover.ends[i]:
            label = f" {cover.labels[i]}" if cover.labels[i] else ""
            parts.append(
                f"{whose}maintenance window{label} closes at "
                f"{_iso(cover.ends[i])}, before {take} (allowOverrun: false)"
            )
        else:
            parts.append(closed)

    run, prov, own = sched.run, sched.prov, plan.exclusions
    excluded(own, "")
    if run is not None:
        names = f" ({plan.window_names})" if plan.window_names else ""
        outside(run, "", f"no maintenance window is open{names}")
    excluded(prov.exclusions, "the provider's ")
    if prov.cover is not None:
        outside(prov.cover, "the provider's ", "outside the provider's maintenance windows")
    if not parts and sched.blocked.blocks(now):  # pragma: no cover - every block is named above
        parts.append("a maintenance exclusion applies")
    return "; ".join(parts)


# -- validation ---------------------------------------------------------------------------------


def _read_problems(where: str, m: api.Maintenance) -> list[tuple[str, str]]:
    """Fields that cannot be read at all (time zones, rrules, times): (field, message)."""
    dot = f"{where}." if where else ""
    problems: list[tuple[str, str]] = []
    for i, w in enumerate(m.windows or []):
        at = f"{dot}windows[{i}]"
        try:
            time_zone(w.time_zone)
        except ValueError as err:
            problems.append((f"{at}.timeZone", str(err)))
        if w.rrule is not None and w.days is not None:
            problems.append((at, "sets both days and rrule; keep one of them"))
        if w.rrule is not None:
            try:
                parse_recurrence(w.rrule, local=True)
            except ValueError as err:
                problems.append(
                    (f"{at}.rrule", f"{w.rrule!r}: {err} (RFC 5545, e.g. FREQ=MONTHLY;BYDAY=1SA)")
                )
        length = _duration(w.duration)
        if length is None:
            problems.append((f"{at}.duration", f"{w.duration!r} is not a duration such as 4h"))
        elif length > _LONGEST:
            problems.append((f"{at}.duration", f"{w.duration} is longer than 366 days; shorten it"))
    expected = _duration(m.expected_duration)
    if expected is not None and expected > _LONGEST:
        problems.append(
            (f"{dot}expectedDuration", f"{m.expected_duration} is longer than 366 days; shorten it")
        )
    for i, x in enumerate(m.exclusions or []):
        at = f"{dot}exclusions[{i}]"
        times = []
        for field, text in (("start", x.start), ("end", x.end)):
            try:
                times.append(parse_time(text))
            except ValueError as err:
                problems.append((f"{at}.{field}", str(err)))
        if len(times) == 2 and times[1] <= times[0]:
            problems.append(
                (f"{at}.end", f"{x.end} is not after start {x.start}; set an end after the start")
            )
    return problems


def _occurs(text: str) -> bool:
    """True unless the (readable) rule yields nothing within ten years of its first day."""
    try:
        rule = parse_recurrence(text, local=True)
    except ValueError:
        return True  # reported as unreadable
    first = datetime.combine(rule.anchor or RRULE_ANCHOR, datetime.min.time(), UTC)
    until = first + timedelta(days=3660)
    if rule.until is not None:
        until = min(until, rule.until)
    if until < first:
        return False
    found = _rule(rule.body, first).replace(until=until)
    return next(iter(found), None) is not None


def maintenance_problems(where: str, m: api.Maintenance) -> list[tuple[str, str]]:
    """Everything wrong with one maintenance spec at `where` (e.g. spec.strategy.maintenance):
    (field path, message with the fix)."""
    problems = _read_problems(where, m)
    if m.windows is not None and not m.windows:
        problems.append(
            (f"{where}.windows", "is empty; list windows or remove it (unset: always open)")
        )
    for i, w in enumerate(m.windows or []):
        at = f"{where}.windows[{i}]"
        if w.days is not None and not w.days:
            problems.append((f"{at}.days", "is empty; list days or remove it (unset: every day)"))
        if w.rrule is not None and not _occurs(w.rrule):
            problems.append(
                (f"{at}.rrule", f"{w.rrule!r} never occurs; check BYMONTH / BYMONTHDAY / UNTIL")
            )
    expected = _duration(m.expected_duration)
    only = m.windows[0] if m.windows and len(m.windows) == 1 else None
    length = _duration(only.duration) if only is not None else None
    if (
        expected is not None
        and only is not None
        and length is not None
        and not m.allow_overrun
        and length < min(expected, timedelta(hours=23))
    ):
        problems.append(
            (
                f"{where}.expectedDuration",
                f"{m.expected_duration} is longer than the only window ({only.duration} "
                "long, so no cluster could ever start); lengthen the window, shorten "
                "expectedDuration or set allowOverrun: true",
            )
        )
    return problems
