"""Errors a plugin raises, each carrying the gRPC status code the contract assigns to it."""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyExists",
    "Conflict",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PluginError",
    "Unavailable",
    "Unimplemented",
]


class PluginError(Exception):
    """An error answered to the caller as a gRPC status with a deterministic message."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(PluginError):
    """A request field is missing or malformed; the message names the field and the fix."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(PluginError):
    """The named cluster, node pool, operation or gate does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(PluginError):
    """The thing to create exists already in a different shape."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Conflict(PluginError):
    """Another operation is in flight for the cluster (ABORTED); the message names it."""

    code = grpc.StatusCode.ABORTED

    def __init__(self, message: str, operation_id: str) -> None:
        super().__init__(message)
        self.operation_id = operation_id


class FailedPrecondition(PluginError):
    """The provider would refuse the request in the cluster's current state."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(PluginError):
    """The provider cannot be reached now; the caller retries with backoff."""

    code = grpc.StatusCode.UNAVAILABLE


class Unimplemented(PluginError):
    """The RPC is outside the plugin's declared capabilities."""

    code = grpc.StatusCode.UNIMPLEMENTED
