"""Errors a plugin raises, each carrying the gRPC status code and the error details the contract
assigns to it (google.rpc.ErrorInfo reason, and RetryInfo when a later retry can help)."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

__all__ = [
    "ERROR_DOMAIN",
    "AlreadyExists",
    "Conflict",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PluginError",
    "Reason",
    "Unavailable",
    "Unimplemented",
    "status_code",
    "status_proto",
]

ERROR_DOMAIN = "fleetupgrade.io"
"""The google.rpc.ErrorInfo domain of every reason the contract defines."""


class Reason(enum.StrEnum):
    """The contract's google.rpc.ErrorInfo reasons (docs/plugin-contract.md, error details)."""

    INVALID_FIELD = "INVALID_FIELD"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    NOT_FOUND = "NOT_FOUND"
    CLUSTER_NOT_FOUND = "CLUSTER_NOT_FOUND"
    NODE_POOL_NOT_FOUND = "NODE_POOL_NOT_FOUND"
    OPERATION_NOT_FOUND = "OPERATION_NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    OPERATION_IN_FLIGHT = "OPERATION_IN_FLIGHT"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    VERSION_NOT_OFFERED = "VERSION_NOT_OFFERED"
    DOWNGRADE_NOT_SUPPORTED = "DOWNGRADE_NOT_SUPPORTED"
    MINOR_VERSION_SKIP = "MINOR_VERSION_SKIP"
    NODE_POOL_AHEAD_OF_CONTROL_PLANE = "NODE_POOL_AHEAD_OF_CONTROL_PLANE"
    CLUSTER_BUSY = "CLUSTER_BUSY"
    CLUSTER_UNAVAILABLE = "CLUSTER_UNAVAILABLE"
    MAINTENANCE_EXCLUSION = "MAINTENANCE_EXCLUSION"
    PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    INTERNAL = "INTERNAL"


class PluginError(Exception):
    """An error answered to the caller as a gRPC status with a deterministic message.

    reason (google.rpc.ErrorInfo.reason, domain ERROR_DOMAIN) tells a program what happened;
    metadata adds machine-readable facts (never secrets). retry_after (seconds) sends a
    google.rpc.RetryInfo: a later retry of the same request can succeed. retryable says
    whether a retry can help at all (a class default; retry_after implies it).
    """

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    default_reason: str = Reason.INTERNAL
    default_retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason: str = str(reason or self.default_reason)
        self.metadata: dict[str, str] = dict(metadata or {})
        if retry_after is not None and retry_after < 0:
            raise ValueError("retry_after: must be 0 or more seconds")
        self.retry_after = retry_after
        if retryable is None:
            retryable = self.default_retryable or retry_after is not None
        self.retryable = retryable

    def status(self) -> status_pb2.Status:
        """The google.rpc.Status sent to the caller: code, message, ErrorInfo and RetryInfo."""
        return status_proto(
            self.code,
            self.message,
            reason=self.reason,
            metadata=self.metadata,
            retry_after=self.retry_after if self.retryable else None,
            retryable=self.retryable,
        )


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC code of a google.rpc.Code number (UNKNOWN for a number that is none); an
    error's number that says OK reads as UNKNOWN too: an error must not read as success."""
    code = _CODES.get(number, grpc.StatusCode.UNKNOWN)
    return grpc.StatusCode.UNKNOWN if code is grpc.StatusCode.OK else code


def status_proto(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str,
    metadata: Mapping[str, str] | None = None,
    retry_after: float | None = None,
    retryable: bool = False,
) -> status_pb2.Status:
    """A google.rpc.Status with an ErrorInfo, plus a RetryInfo when retryable.

    A retryable error without a known delay carries RetryInfo with retry_delay 0: "retry with
    your own backoff".
    """
    info = error_details_pb2.ErrorInfo(
        reason=str(reason), domain=ERROR_DOMAIN, metadata=dict(metadata or {})
    )
    details = [_pack(info)]
    if retryable or retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round((retry_after or 0.0) * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    return status_pb2.Status(code=code.value[0], message=message, details=details)


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.RetryInfo) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


class InvalidArgument(PluginError):
    """A request field is missing or malformed; the message names the field and the fix."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = Reason.INVALID_FIELD

    def __init__(self, field: str, problem: str, *, reason: str | None = None) -> None:
        super().__init__(f"{field}: {problem}", reason=reason, metadata={"field": field})
        self.field = field


class NotFound(PluginError):
    """The named cluster, node pool, operation or gate does not exist."""

    code = grpc.StatusCode.NOT_FOUND
    default_reason = Reason.NOT_FOUND


class AlreadyExists(PluginError):
    """The thing to create exists already in a different shape."""

    code = grpc.StatusCode.ALREADY_EXISTS
    default_reason = Reason.ALREADY_EXISTS


class Conflict(PluginError):
    """Another operation is in flight for the cluster (ABORTED); the message names it.

    Not retryable as such: the caller follows the named operation, then decides.
    """

    code = grpc.StatusCode.ABORTED
    default_reason = Reason.OPERATION_IN_FLIGHT

    def __init__(self, message: str, operation_id: str) -> None:
        super().__init__(message, metadata={"operation_id": operation_id})
        self.operation_id = operation_id


class FailedPrecondition(PluginError):
    """The provider would refuse the request in the cluster's current state.

    Never retryable unless retry_after (or retryable=True) says a later attempt can succeed,
    e.g. reason CLUSTER_BUSY; VERSION_NOT_OFFERED and the skew reasons never are.
    """

    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = Reason.FAILED_PRECONDITION


class Unavailable(PluginError):
    """The provider cannot be reached now; the caller retries with backoff."""

    code = grpc.StatusCode.UNAVAILABLE
    default_reason = Reason.PROVIDER_UNAVAILABLE
    default_retryable = True


class Unimplemented(PluginError):
    """The RPC is outside the plugin's declared capabilities."""

    code = grpc.StatusCode.UNIMPLEMENTED
    default_reason = Reason.NOT_IMPLEMENTED
