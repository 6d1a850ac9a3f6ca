"""W3C trace context for the server: continue a caller's ``traceparent``, answer with ours, and
record one server span per request over OpenTelemetry when a tracer provider is there.

The ids travel without OpenTelemetry (a response always carries a ``traceparent``: the caller's
trace id, or a new one, and this request's span id). Spans are recorded with the tracer provider
given to :func:`~mmchaos.server.create_app`, else one exporting to ``ServerConfig.otlp_endpoint``,
else OpenTelemetry's global provider when ``opentelemetry-api`` is installed (a no-op unless the
process configured one). opentelemetry is imported only here, and only when present.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mmchaos.errors import MissingDependencyError

__all__ = ["TRACEPARENT_HEADER", "RequestTracer", "TraceContext", "otlp_tracer_provider", "parse_traceparent"]

TRACEPARENT_HEADER = "traceparent"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16 lower-case hex digits
    flags: str = "01"  # "01": sampled

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        return TraceContext(self.trace_id, _new_id(8), self.flags)


def _new_id(n_bytes: int) -> str:
    while True:
        value = secrets.token_hex(n_bytes)
        if value.strip("0"):
            return value


def parse_traceparent(value: str | None) -> TraceContext | None:
    """The caller's context from a ``traceparent`` header, or None when absent or malformed."""
    match = _TRACEPARENT.match((value or "").strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or not trace_id.strip("0") or not span_id.strip("0"):
        return None
    return TraceContext(trace_id, span_id, flags)


def new_trace() -> TraceContext:
    return TraceContext(_new_id(16), _new_id(8))


def _otel(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def otlp_tracer_provider(endpoint: str, service_name: str) -> Any:
    """An SDK tracer provider that batches spans to an OTLP/HTTP endpoint."""
    sdk = _otel("opentelemetry.sdk.trace")
    export = _otel("opentelemetry.sdk.trace.export")
    resources = _otel("opentelemetry.sdk.resources")
    otlp = _otel("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    if sdk is None or export is None or resources is None or otlp is None:
        raise MissingDependencyError(
            "otlp_endpoint needs the OpenTelemetry SDK and OTLP exporter; install them with: "
            "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
        )
    provider = sdk.TracerProvider(resource=resources.Resource.create({"service.name": service_name}))
    provider.add_span_processor(export.BatchSpanProcessor(otlp.OTLPSpanExporter(endpoint=endpoint)))
    return provider


class RequestTracer:
    """One server span per request, parented on the caller's trace context."""

    def __init__(self, provider: Any = None) -> None:
        self._trace = _otel("opentelemetry.trace")
        self._tracer: Any = None
        if self._trace is not None:
            source = provider if provider is not None else self._trace.get_tracer_provider()
            self._tracer = source.get_tracer("mmchaos.server")

    @contextlib.contextmanager
    def span(
        self, name: str, parent: TraceContext | None, attributes: Mapping[str, Any]
    ) -> Iterator[tuple[TraceContext, Any]]:
        """Run the block in this request's span; yields its trace context and the span (or None)."""
        ours = parent.child() if parent is not None else new_trace()
        if self._tracer is None or self._trace is None:
            yield ours, None
            return
        trace = self._trace
        context = None
        if parent is not None:
            remote = trace.SpanContext(
                trace_id=int(parent.trace_id, 16),
                span_id=int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(int(parent.flags, 16)),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        with self._tracer.start_as_current_span(
            name, context=context, kind=trace.SpanKind.SERVER, attributes=dict(attributes)
        ) as span:
            ctx = span.get_span_context()
            if span.is_recording() and ctx.is_valid:
                flags = format(ctx.trace_flags, "02x")
                ours = TraceContext(format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), flags)
            yield ours, span if span.is_recording() else None
