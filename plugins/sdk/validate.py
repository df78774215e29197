"""Request-field checks shared by every plugin, raising InvalidArgument that names the field."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from plugins.sdk import versions
from plugins.sdk.errors import InvalidArgument

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "KeyPage",
    "PageRequest",
    "check_page_size",
    "check_version",
    "decode_page_token",
    "encode_page_token",
    "page_request",
    "require",
    "require_all",
    "require_request_id",
]

DEFAULT_PAGE_SIZE = 500
"""ListClusters page size when the request says 0 (contract)."""

MAX_PAGE_SIZE = 5000
"""Largest ListClusters page (contract); larger requests are served this many."""

_TOKEN_PREFIX = "v1:"

# How to fill in each field the contract makes REQUIRED, for the error message.
_HINTS: dict[str, str] = {
    "request_id": "a caller-chosen id, unique per intended change",
    "cluster_id": "a cluster id from ListClusters",
    "cluster_ids": "one or more cluster ids from ListClusters",
    "node_pool": "a node pool name from the cluster's node_pools",
    "version": "the target version, e.g. 1.29.4",
    "operation_id": "the id of an Operation a mutating RPC returned",
    "workloads": "one or more workloads (namespace and name)",
    "namespace": "the workload's namespace",
    "name": "the workload's name",
    "query": "the provider query text",
    "gate_id": "a gate id from ListGates",
    "reason": "why, for people",
}


class _HasRequestId(Protocol):
    @property
    def request_id(self) -> str: ...


def require(field: str, value: str, hint: str = "") -> str:
    """Returns value; InvalidArgument "<field>: must not be empty; set it to ..." when empty."""
    if not value:
        what = hint or _HINTS.get(field.rsplit(".", 1)[-1].split("[", 1)[0], "a value")
        raise InvalidArgument(field, f"must not be empty; set it to {what}")
    return value


def require_all(field: str, values: Sequence[str], hint: str = "") -> list[str]:
    """Returns the values; InvalidArgument when the list or one of its items is empty."""
    if not values:
        what = hint or _HINTS.get(field, "one or more values")
        raise InvalidArgument(field, f"must not be empty; set it to {what}")
    for index, value in enumerate(values):
        if not value:
            raise InvalidArgument(f"{field}[{index}]", "must not be empty; remove it or fill it in")
    return list(values)


def require_request_id(request: _HasRequestId) -> str:
    """The request's request_id; InvalidArgument when empty."""
    return require("request_id", request.request_id)


def check_version(field: str, value: str) -> str:
    """Returns a non-empty, parseable version; InvalidArgument naming field and form otherwise."""
    require(field, value)
    try:
        versions.parse(value)
    except ValueError:
        raise InvalidArgument(
            field, f"{value!r} is not a version; write it like 1.29.4 or 1.29.4-gke.100"
        ) from None
    return value


def check_page_size(page_size: int) -> int:
    """The page size to serve: 0 → DEFAULT_PAGE_SIZE, above MAX_PAGE_SIZE → MAX_PAGE_SIZE.

    A negative size is an InvalidArgument.
    """
    if page_size < 0:
        raise InvalidArgument(
            "page_size", f"must be 0..{MAX_PAGE_SIZE}; use 0 for the default ({DEFAULT_PAGE_SIZE})"
        )
    if page_size == 0:
        return DEFAULT_PAGE_SIZE
    return min(page_size, MAX_PAGE_SIZE)


def encode_page_token(last_key: str) -> str:
    """An opaque next_page_token that resumes after last_key."""
    raw = (_TOKEN_PREFIX + last_key).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class KeyPage:
    """One page of keys (cluster ids) in order, with what ListClustersResponse says of it."""

    keys: list[str]
    #: Resumes after this page's last key; "" on the last page.
    next_page_token: str
    #: How many keys there are over every page.
    total_size: int


@dataclass(frozen=True)
class PageRequest:
    """A ListClusters request's paging, checked (page_request): how many keys a page holds
    and the key it resumes after ("" for the first page)."""

    size: int
    after: str

    def page(self, keys: Iterable[str]) -> KeyPage:
        """The page of keys, in sorted order, this request asks for."""
        ordered = sorted(keys)
        after = self.after
        start = next((i for i, k in enumerate(ordered) if k > after), len(ordered)) if after else 0
        page = ordered[start : start + self.size]
        more = start + self.size < len(ordered)
        return KeyPage(page, encode_page_token(page[-1]) if more and page else "", len(ordered))


def page_request(page_size: int, page_token: str) -> PageRequest:
    """The paging of a ListClusters request (check_page_size, decode_page_token: an
    InvalidArgument before anything is read). One home for the paging the GKE, EKS and AKS
    plugins each wrote."""
    return PageRequest(check_page_size(page_size), decode_page_token(page_token))


def decode_page_token(token: str) -> str:
    """The key a page token resumes after ("" for an empty token).

    InvalidArgument when the token was not made by encode_page_token.
    """
    if not token:
        return ""
    try:
        text = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    if not text.startswith(_TOKEN_PREFIX):
        raise InvalidArgument(
            "page_token",
            "is not a next_page_token of this plugin; pass one from the previous response "
            "or leave it empty to start from the first page",
        )
    return text[len(_TOKEN_PREFIX) :]
