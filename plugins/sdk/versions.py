"""Kubernetes version strings ("1.29.4", "v1.29", "1.29.4-gke.100") parsed and ordered."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

__all__ = ["Version", "compare", "is_downgrade", "is_newer", "meets", "parse"]

_PATTERN = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+]([0-9A-Za-z.+-]+))?$")


class Version(NamedTuple):
    """A parsed version; tuples order by (major, minor, patch, release, suffix)."""

    major: int
    minor: int
    patch: int
    release: int  # 0 for a pre-release (alpha, beta, rc), 1 otherwise
    suffix: tuple[tuple[int, int | str], ...]

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.suffix:
            text += "-" + ".".join(str(part) for _, part in self.suffix)
        return text


@lru_cache(maxsize=65536)
def parse(text: str) -> Version:
    """Parse a version; ValueError names the expected form.

    A provider suffix ("-gke.100") orders after the bare version and numerically within
    itself, so 1.29.4-gke.100 < 1.29.4-gke.1200 and 1.29.4 < 1.29.4-gke.100. A pre-release
    suffix (alpha, beta, rc) orders before the release: 1.30.0-rc.1 < 1.30.0.
    """
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a version; write it like 1.29.4 or 1.29.4-gke.100")
    major, minor, patch, suffix = match.groups()
    parts: list[tuple[int, int | str]] = []
    for piece in re.split(r"[.+-]", suffix or ""):
        if piece:
            # (0, n) sorts numeric pieces before (1, text) pieces; both are comparable tuples.
            parts.append((0, int(piece)) if piece.isdigit() else (1, piece))
    pre = bool(suffix) and re.match(r"(alpha|beta|rc)", suffix) is not None
    return Version(int(major), int(minor), int(patch or 0), 0 if pre else 1, tuple(parts))


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version a is older than, equal to or newer than b."""
    va, vb = parse(a), parse(b)
    return (va > vb) - (va < vb)


def is_newer(a: str, b: str) -> bool:
    """True when version a is strictly newer than b."""
    return parse(a) > parse(b)


def meets(current: str, target: str) -> bool:
    """True when a cluster at current has reached target.

    A bare target (no suffix) is met by any provider build of the same release, so a target
    of 1.29.1 is met by 1.29.1-gke.1589020; a suffixed target needs that build or newer.
    """
    now, want = parse(current), parse(target)
    if not want.suffix and now[:3] == want[:3] and now.release == 1:
        return True
    return now >= want


def is_downgrade(current: str, target: str) -> bool:
    """True when moving from current to target would go backwards.

    A bare target of the cluster's own release (1.29.1 for 1.29.1-gke.100) is no downgrade.
    """
    now, want = parse(current), parse(target)
    same_release = not want.suffix and now[:3] == want[:3] and now.release == 1
    return now > want and not same_release
