"""Server interceptor: PluginError to gRPC status, capability refusals, RPC logs and metrics."""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc
from grpc_status import rpc_status
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from plugins.sdk.errors import PluginError, Reason, Unimplemented, status_proto

__all__ = [
    "CALLER_METADATA_KEY",
    "INTERNAL_MESSAGE",
    "OPERATION_ID_METADATA_KEY",
    "JsonFormatter",
    "RpcInterceptor",
    "RpcMetrics",
    "abort_with_details",
    "context_code",
    "rpc_metrics",
]

CALLER_METADATA_KEY = "x-fleetupgrade-caller"
"""Metadata key in which a caller names itself (contract: OPTIONAL)."""

OPERATION_ID_METADATA_KEY = "x-fleetupgrade-operation-id"
"""Trailing metadata key carrying the in-flight operation id of an ABORTED (Conflict) answer."""

_LOG = logging.getLogger("plugins.sdk.rpc")
INTERNAL_MESSAGE = "internal error in the plugin; see the plugin's log"
"""What an unexpected exception in a servicer answers (its details go to the log only)."""
_MAX_CALLER_LEN = 128

# Codes that say the caller sent something the plugin refused: worth INFO, not WARNING.
_CALLER_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

# Latency buckets in seconds, from sub-millisecond loopback calls to slow provider calls.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object per line; `extra={"fields": {...}}` adds keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, sort_keys=False)


class RpcMetrics:
    """The RPC counter and latency histogram of one prometheus registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "fleet_plugin_rpc_total",
            "RPCs served by the plugin, by method and status code.",
            ("plugin", "method", "code"),
            registry=registry,
        )
        self.duration = Histogram(
            "fleet_plugin_rpc_duration_seconds",
            "Time to serve an RPC (for streams: the stream's lifetime).",
            ("plugin", "method"),
            buckets=_BUCKETS,
            registry=registry,
        )

    def observe(self, plugin: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Counts one finished RPC."""
        self.calls.labels(plugin, method, code.name).inc()
        self.duration.labels(plugin, method).observe(seconds)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, RpcMetrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.Lock()


def rpc_metrics(registry: CollectorRegistry = REGISTRY) -> RpcMetrics:
    """Returns the registry's RPC metrics, creating them once (safe to call many times)."""
    with _METRICS_LOCK:
        metrics = _METRICS.get(registry)
        if metrics is None:
            metrics = RpcMetrics(registry)
            _METRICS[registry] = metrics
        return metrics


def _short_method(full_method: str) -> str:
    """'/fleetupgrade.plugin.v1.ClusterService/GetCluster' -> 'ClusterService/GetCluster'."""
    service, _, method = full_method.lstrip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{method}"


def _caller(details: grpc.HandlerCallDetails) -> str:
    for key, value in details.invocation_metadata or ():
        if key == CALLER_METADATA_KEY:
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return text[:_MAX_CALLER_LEN]
    return ""


class _RichStatus(grpc.Status):
    """A status with google.rpc.Status details (and any extra trailing metadata)."""

    def __init__(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[tuple[str, Any], ...]
    ) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


def abort_with_details(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str,
    metadata: Mapping[str, str] | None = None,
    retry_after: float | None = None,
    retryable: bool = False,
    extra_trailing: tuple[tuple[str, str], ...] = (),
) -> None:
    """Ends the RPC with code and message, google.rpc.ErrorInfo and (retryable) RetryInfo."""
    rich = status_proto(
        code,
        message,
        reason=reason,
        metadata=metadata,
        retry_after=retry_after,
        retryable=retryable,
    )
    _abort_status(context, rich, extra_trailing)


def _abort_status(
    context: grpc.ServicerContext, rich: Any, extra_trailing: tuple[tuple[str, str], ...] = ()
) -> None:
    packed = rpc_status.to_status(rich)
    context.abort_with_status(
        _RichStatus(packed.code, packed.details, (*extra_trailing, *packed.trailing_metadata))
    )


def context_code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    """The code the servicer set on the context itself (set_code or abort), if any."""
    getter = getattr(context, "code", None)
    code = getter() if callable(getter) else None
    return code if isinstance(code, grpc.StatusCode) else None


class _Call:
    """Bookkeeping of one RPC: settles its status once, then logs and counts it."""

    __slots__ = ("_caller", "_done", "_interceptor", "_method", "_start")

    def __init__(self, interceptor: RpcInterceptor, method: str, caller: str) -> None:
        self._interceptor = interceptor
        self._method = method
        self._caller = caller
        self._start = time.perf_counter()
        self._done = False

    def finish(
        self, code: grpc.StatusCode, message: str = "", exc: BaseException | None = None
    ) -> None:
        if self._done:
            return
        self._done = True
        seconds = time.perf_counter() - self._start
        self._interceptor.record(
            method=self._method,
            caller=self._caller,
            code=code,
            message=message,
            seconds=seconds,
            exc=exc,
        )

    def fail(self, exc: Exception, context: grpc.ServicerContext) -> None:
        """Turns an exception raised by a servicer into the RPC's status (raises)."""
        if isinstance(exc, PluginError):
            self.finish(exc.code, exc.message)
            operation_id = getattr(exc, "operation_id", "")
            extra = ((OPERATION_ID_METADATA_KEY, operation_id),) if operation_id else ()
            _abort_status(context, exc.status(), extra)
        preset = context_code(context)
        if isinstance(exc, NotImplementedError) and preset in (None, grpc.StatusCode.UNIMPLEMENTED):
            # The generated base servicer: set_code(UNIMPLEMENTED) + NotImplementedError.
            self.finish(grpc.StatusCode.UNIMPLEMENTED, "method not implemented")
            abort_with_details(
                context,
                grpc.StatusCode.UNIMPLEMENTED,
                "method not implemented",
                reason=Reason.NOT_IMPLEMENTED,
            )
        if preset is not None and preset is not grpc.StatusCode.OK:
            # The servicer called context.abort itself: its status stands.
            self.finish(preset)
            raise exc
        self.finish(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, exc)
        abort_with_details(
            context, grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, reason=Reason.INTERNAL
        )


def _refuse_unary(message: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        raise Unimplemented(message)

    return refuse


def _refuse_stream(message: str) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
    def refuse(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        raise Unimplemented(message)
        yield  # a generator, like the handler it replaces

    return refuse


class RpcInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps unary and server-streaming handlers: error mapping, structured log, metrics."""

    def __init__(
        self,
        plugin_name: str,
        metrics: RpcMetrics,
        refused: Mapping[str, str] | None = None,
    ) -> None:
        self._plugin = plugin_name
        self._metrics = metrics
        # Full method name -> UNIMPLEMENTED message, for RPCs outside the capabilities.
        self._refused = dict(refused or {})
        self._children: dict[tuple[str, grpc.StatusCode], tuple[Any, Any]] = {}

    def record(
        self,
        *,
        method: str,
        caller: str,
        code: grpc.StatusCode,
        message: str,
        seconds: float,
        exc: BaseException | None,
    ) -> None:
        """Logs one finished RPC (never its request body) and counts it."""
        key = (method, code)
        children = self._children.get(key)
        if children is None:
            children = (
                self._metrics.calls.labels(self._plugin, method, code.name),
                self._metrics.duration.labels(self._plugin, method),
            )
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)
        if code is grpc.StatusCode.OK:
            level = logging.DEBUG
        elif code in _CALLER_CODES:
            level = logging.INFO
        elif exc is not None:
            level = logging.ERROR
        else:
            level = logging.WARNING
        if not _LOG.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "plugin": self._plugin,
            "method": method,
            "code": code.name,
            "duration_ms": round(seconds * 1000.0, 3),
            "caller": caller,
        }
        if message:
            fields["error"] = message
        _LOG.log(
            level,
            "rpc %s %s",
            method,
            code.name,
            extra={"fields": fields},
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
        )

    def record_item(
        self, method: str, caller: str, code: grpc.StatusCode, message: str, seconds: float
    ) -> None:
        """`record` of one item of a batch call (StartOperations, PreflightUpgrades), as the
        RPC it stands for."""
        self.record(
            method=method, caller=caller, code=code, message=message, seconds=seconds, exc=None
        )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],  # type: ignore[type-arg]
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:  # type: ignore[type-arg]
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = _short_method(handler_call_details.method)
        caller = _caller(handler_call_details)
        refusal = self._refused.get(handler_call_details.method)
        if handler.response_streaming and handler.unary_stream is not None:
            stream = handler.unary_stream if refusal is None else _refuse_stream(refusal)
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(stream, method, caller),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is not None:
            unary = handler.unary_unary if refusal is None else _refuse_unary(refusal)
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(unary, method, caller),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(
        self,
        behavior: Callable[[Any, grpc.ServicerContext], Any],
        method: str,
        caller: str,
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            call = _Call(self, method, caller)
            try:
                response = behavior(request, context)
            except Exception as exc:
                call.fail(exc, context)
                raise  # unreachable: fail() always raises
            call.finish(context_code(context) or grpc.StatusCode.OK)
            return response

        return unary

    def _wrap_stream(
        self,
        behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
        method: str,
        caller: str,
    ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
        def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            call = _Call(self, method, caller)
            try:
                yield from behavior(request, context)
            except GeneratorExit:
                call.finish(grpc.StatusCode.CANCELLED)
                raise
            except Exception as exc:
                call.fail(exc, context)
                raise  # unreachable: fail() always raises
            finally:
                if not context.is_active():
                    call.finish(grpc.StatusCode.CANCELLED)
            call.finish(context_code(context) or grpc.StatusCode.OK)

        return stream
