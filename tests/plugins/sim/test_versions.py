"""plugins.sdk.versions, which the sim's version rules rely on: forms, order, errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.sdk.versions import compare, is_newer, parse


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("1.28.5", "1.29.0"),
        ("1.29.9", "1.29.10"),  # numeric, not text order
        ("1.9.0", "1.10.0"),
        ("1.29.4", "1.29.4-gke.100"),  # a provider build orders after the bare version
        ("1.29.4-gke.100", "1.29.4-gke.1200"),
        ("1.29.4-gke.1200", "1.29.5"),
        ("1.29", "1.29.1"),
        ("1.30.0-rc.1", "1.30.0"),  # a pre-release orders before its release
        ("1.30.0-alpha.2", "1.30.0-beta.0"),
        ("1.29.9", "1.30.0-alpha.0"),
    ],
)
def test_order(older: str, newer: str) -> None:
    assert compare(older, newer) == -1 and compare(newer, older) == 1
    assert is_newer(newer, older) and not is_newer(older, newer)


@pytest.mark.parametrize(
    ("a", "b"), [("v1.29", "1.29.0"), (" 1.29.4 ", "1.29.4"), ("v1.2.3", "1.2.3")]
)
def test_equal_forms(a: str, b: str) -> None:
    assert compare(a, b) == 0
    assert not is_newer(a, b)


def test_text_form() -> None:
    assert str(parse("v1.29")) == "1.29.0"
    assert str(parse("1.29.4-gke.100")) == "1.29.4-gke.100"


@pytest.mark.parametrize("bad", ["", "1", "v", "1.2.3.4", "x1.2", "1..2", "latest"])
def test_not_versions(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not a version; write it like 1\.29\.4"):
        parse(bad)


_numbers = st.integers(min_value=0, max_value=300)
_versions = st.builds(
    lambda a, b, c, build, v: f"{'v' if v else ''}{a}.{b}.{c}" + (f"-gke.{build}" if build else ""),
    _numbers,
    _numbers,
    _numbers,
    st.one_of(st.none(), st.integers(min_value=1, max_value=5000)),
    st.booleans(),
)


@given(_versions, _versions, _versions)
def test_compare_is_a_total_order(a: str, b: str, c: str) -> None:
    assert compare(a, a) == 0
    assert compare(a, b) == -compare(b, a)
    if compare(a, b) <= 0 and compare(b, c) <= 0:
        assert compare(a, c) <= 0


@given(_versions)
def test_text_form_round_trips(text: str) -> None:
    assert compare(str(parse(text)), text) == 0


@pytest.mark.parametrize(
    ("current", "target", "met", "downgrade"),
    [
        ("1.29.1-gke.1589020", "1.29.1", True, False),  # a bare target is met by its builds
        ("1.29.1", "1.29.1", True, False),
        ("1.29.0-gke.9", "1.29.1", False, False),
        ("1.29.1-rc.1", "1.29.1", False, False),  # a pre-release does not meet the release
        ("1.29.1-gke.100", "1.29.1-gke.200", False, False),
        ("1.29.1-gke.200", "1.29.1-gke.100", True, True),
        ("1.29.2", "1.29.1", True, True),
    ],
)
def test_meets_and_downgrade(current: str, target: str, met: bool, downgrade: bool) -> None:
    from plugins.sdk.versions import is_downgrade, meets

    assert meets(current, target) is met
    assert is_downgrade(current, target) is downgrade
