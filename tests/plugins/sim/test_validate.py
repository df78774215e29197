"""Request-field checks: empty fields, versions, page sizes and page tokens."""

from __future__ import annotations

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.errors import InvalidArgument
from plugins.sdk.validate import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    check_page_size,
    check_version,
    decode_page_token,
    encode_page_token,
    require,
    require_all,
    require_request_id,
)


def test_require_names_the_field_and_how_to_fill_it() -> None:
    assert require("cluster_id", "c1") == "c1"
    with pytest.raises(InvalidArgument) as err:
        require("cluster_id", "")
    assert err.value.field == "cluster_id"
    assert err.value.message == (
        "cluster_id: must not be empty; set it to a cluster id from ListClusters"
    )
    with pytest.raises(InvalidArgument, match=r"^workloads\[1\]\.namespace: must not be empty"):
        require("workloads[1].namespace", "")
    with pytest.raises(InvalidArgument, match="set it to the moon"):
        require("x", "", "the moon")


def test_require_request_id_reads_the_request() -> None:
    assert require_request_id(cluster_pb2.ServiceOutRequest(request_id="r1")) == "r1"
    with pytest.raises(InvalidArgument, match=r"^request_id: must not be empty"):
        require_request_id(cluster_pb2.ServiceOutRequest(cluster_id="c1"))


def test_require_all_rejects_empty_lists_and_items() -> None:
    assert require_all("cluster_ids", ["a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidArgument, match=r"^cluster_ids: must not be empty"):
        require_all("cluster_ids", [])
    with pytest.raises(InvalidArgument, match=r"^cluster_ids\[1\]: must not be empty"):
        require_all("cluster_ids", ["a", ""])


@pytest.mark.parametrize("good", ["1.29.4", "v1.29", "1.29.4-gke.100"])
def test_check_version_accepts_kubernetes_forms(good: str) -> None:
    assert check_version("version", good) == good


@pytest.mark.parametrize("bad", ["latest", "1", "1.x.3"])
def test_check_version_rejects_other_text(bad: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_version("version", bad)
    assert err.value.message == (
        f"version: {bad!r} is not a version; write it like 1.29.4 or 1.29.4-gke.100"
    )
    with pytest.raises(InvalidArgument, match=r"^version: must not be empty"):
        check_version("version", "")


def test_page_size_defaults_caps_and_rejects_negative() -> None:
    assert check_page_size(0) == DEFAULT_PAGE_SIZE == 500
    assert check_page_size(7) == 7
    assert check_page_size(MAX_PAGE_SIZE + 1) == MAX_PAGE_SIZE == 5000
    with pytest.raises(InvalidArgument, match=r"^page_size: must be 0..5000"):
        check_page_size(-1)


@pytest.mark.parametrize("key", ["cluster-00001", "projects/p/locations/l/clusters/c", "é"])
def test_page_token_round_trips(key: str) -> None:
    token = encode_page_token(key)
    assert key not in token
    assert decode_page_token(token) == key
    assert decode_page_token("") == ""


@pytest.mark.parametrize("bad", ["garbage!", "Zm9v", "%%%"])
def test_foreign_page_token_is_invalid(bad: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^page_token: is not a next_page_token"):
        decode_page_token(bad)
