"""OpenTelemetry spans for a request's hops, under the fleet's own W3C `traceparent`.

Each service opens one span per request it handles (`tracer(service).hop(...)`), a child
of the traceparent the request came with; what it sends onward carries `Hop.traceparent`
(its span's context), so the spans of all services form one tree. Stages a service only
knows the times of afterwards (the router's queue, the worker's prefill and decode, from
the timestamps the request and result already carry) are `Hop.child(name, start, end)`.

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set and the `otel`
extra is installed; every other standard variable (`OTEL_EXPORTER_OTLP_HEADERS`,
`OTEL_BSP_*`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`...) is the SDK's to read.
Off, a hop is a plain object that passes the incoming traceparent on unchanged.

Sampling (`SY_TRACE_SAMPLE_RATIO`, 0..1, default 0.1): head sampling, decided once where a
trace starts (the edge, for a request without a client `traceparent`) and carried in the
traceparent's sampled flag, which every later hop follows (parent-based), so the
services agree. Errors are kept: a span that head sampling passed over is still recorded,
and held in its process until its local root (the service's hop) ends; if any span of
that hop failed, the whole hop is exported, else it is dropped. Limit: that decision is
per process - of an unsampled request that failed in the worker, the worker's hop and the
edge's (which answered the error) are exported, but not the hops in between that went
well (the router's), so the tree shows a gap there. The trace id still joins them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from switchyard.errors import SwitchyardError
from switchyard.logging import get_logger

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span
    from opentelemetry.trace import Tracer as OtelTracer

log = get_logger(__name__)

SAMPLE_RATIO = "SY_TRACE_SAMPLE_RATIO"
DEFAULT_SAMPLE_RATIO = 0.1
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# Unsampled traces held waiting for their hop to end, at most (a hop that never ends,
# its process killed mid-request, must not hold memory for ever): the oldest go first.
HELD_TRACES = 10_000


class Hop:
    """One service's span of one request. This one records nothing (tracing off)."""

    def __init__(self, traceparent: str | None) -> None:
        self.traceparent = traceparent  # what the service sends onward

    def child(self, name: str, start: float | None, end: float | None) -> None:
        """A stage of this hop that ran from `start` to `end` (Unix seconds); nothing
        when either is None (a stage this request did not go through)."""

    def fail(self, code: str, reason: str) -> None:
        """The request ended in error at this hop."""

    def end(self, at: float | None = None) -> None: ...


class Tracer:
    """Makes the hops of one service; this one, tracing off, makes no spans."""

    enabled = False

    def begin(
        self, name: str, trace: str | None, *, start: float | None = None, **attrs: Any
    ) -> Hop:
        """A hop from `start` (default now) under `trace`; the caller ends it."""
        return Hop(trace)

    @contextmanager
    def hop(
        self, name: str, trace: str | None, *, start: float | None = None, **attrs: Any
    ) -> Iterator[Hop]:
        """A hop for the block; an exception out of it fails the hop."""
        span = self.begin(name, trace, start=start, **attrs)
        try:
            yield span
        except BaseException as exc:
            span.fail(type(exc).__name__, str(exc))
            raise
        finally:
            span.end()

    def flush(self) -> None: ...


OFF = Tracer()

# Result statuses that are the fleet's failures (cancelled and superseded are the
# asker's own doing; ok is ok): a hop that answers one fails.
FAILED = frozenset({"error", "expired", "rejected", "stale"})


def http_failed(status: int) -> bool:
    """An HTTP answer that is the fleet's failure: a 5xx, or 429 (no capacity for it).
    Other 4xx are the client's mistakes, exported only as sampled, so a scan of bad
    keys cannot flood the collector."""
    return status >= 500 or status == 429


def _ns(at: float | None) -> int | None:
    return None if at is None else int(at * 1e9)


def _attrs(attrs: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    # OpenTelemetry takes no None: an attribute the request does not have is left out.
    return {k: v for k, v in attrs.items() if v is not None}


class _LiveHop(Hop):
    def __init__(self, tracer: OtelTracer, span: Span) -> None:
        ctx = span.get_span_context()
        super().__init__(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}")
        self._tracer, self._span = tracer, span

    def child(self, name: str, start: float | None, end: float | None) -> None:
        if start is None or end is None:
            return
        from opentelemetry.trace import set_span_in_context

        span = self._tracer.start_span(
            name, context=set_span_in_context(self._span), start_time=_ns(start)
        )
        span.end(end_time=_ns(max(start, end)))  # stamps of two clocks may cross

    def fail(self, code: str, reason: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("error.type", code)
        self._span.set_status(Status(StatusCode.ERROR, reason))

    def end(self, at: float | None = None) -> None:
        self._span.end(end_time=_ns(at))


class _OtelTracer(Tracer):
    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("switchyard")

    def begin(
        self, name: str, trace: str | None, *, start: float | None = None, **attrs: Any
    ) -> Hop:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # An invalid or absent traceparent gives an empty context: a root span.
        parent = TraceContextTextMapPropagator().extract({"traceparent": trace or ""})
        span = self._tracer.start_span(
            name, context=parent, start_time=_ns(start), attributes=_attrs(attrs)
        )
        return _LiveHop(self._tracer, span)

    def flush(self) -> None:
        self.provider.force_flush()


def sample_ratio(env: Mapping[str, str] = os.environ) -> float:
    """`SY_TRACE_SAMPLE_RATIO`: the share of new traces exported whole (0..1)."""
    raw = env.get(SAMPLE_RATIO, "").strip()
    if not raw:
        return DEFAULT_SAMPLE_RATIO
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise SwitchyardError(f"{SAMPLE_RATIO} must be a number from 0 to 1, not {raw!r}",
                              code="invalid_request")  # fmt: skip
    return ratio


def build(service: str, exporter: SpanExporter, ratio: float) -> Tracer:
    """A tracer for `service` exporting to `exporter` under the sampling rules above."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service}), sampler=_sampler(ratio)
    )
    provider.add_span_processor(_errors_kept(exporter))
    return _OtelTracer(provider)


_tracers: dict[str, Tracer] = {}


def tracer(service: str) -> Tracer:
    """This process's tracer for `service`: on when an OTLP endpoint is configured and
    the SDK installed (`pip install switchyard[otel]`), else `OFF`; said once in the log."""
    made = _tracers.get(service)
    if made is None:
        made = _tracers[service] = _configured(service)
    return made


def _configured(service: str) -> Tracer:
    endpoint = next((os.environ[k] for k in ENDPOINTS if os.environ.get(k)), None)
    if endpoint is None or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        log.info("otel.off", service=service, reason="no OTEL_EXPORTER_OTLP_ENDPOINT set")
        return OFF
    ratio = sample_ratio()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.info("otel.off", service=service, reason="the otel extra is not installed")
        return OFF
    log.info("otel.on", service=service, endpoint=endpoint, sample_ratio=ratio)
    return build(service, OTLPSpanExporter(), ratio)


def shutdown() -> None:
    """Export what is still queued and stop this process's tracers (a service's last
    act; tests call it between configurations)."""
    for made in _tracers.values():
        if isinstance(made, _OtelTracer):
            made.provider.shutdown()
    _tracers.clear()


def _sampler(ratio: float) -> Any:
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        ParentBased,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )

    class RecordUnsampled(Sampler):
        """Parent-based head sampling (the ratio at a trace's root) whose "no" still
        records the span (unsampled flag), so that an error can keep it."""

        head = ParentBased(TraceIdRatioBased(ratio))

        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            result = self.head.should_sample(*args, **kwargs)
            if result.decision is Decision.DROP:
                return SamplingResult(Decision.RECORD_ONLY, result.attributes, result.trace_state)
            return result

        def get_description(self) -> str:
            return f"RecordUnsampled(ParentBased(TraceIdRatioBased({ratio})))"

    return RecordUnsampled()


def _errors_kept(exporter: SpanExporter) -> Any:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import StatusCode

    class ErrorsKept(BatchSpanProcessor):
        """Exports sampled spans as they end; holds the unsampled ones of each trace until
        a local root (a span whose parent is in another process, or none) ends, then
        exports them all if one of them failed."""

        def __init__(self) -> None:
            super().__init__(exporter)
            self.held: dict[int, list[ReadableSpan]] = {}

        def on_end(self, span: ReadableSpan) -> None:
            ctx = span.context
            if ctx is None or ctx.trace_flags.sampled:
                super().on_end(span)
                return
            held = self.held.setdefault(ctx.trace_id, [])
            held.append(span)
            if len(self.held) > HELD_TRACES:
                del self.held[next(iter(self.held))]
            if span.parent is not None and not span.parent.is_remote:
                return  # its hop goes on
            del self.held[ctx.trace_id]
            if any(s.status.status_code is StatusCode.ERROR for s in held):
                for kept in held:
                    # `on_end` passes unsampled spans over; the batch queue takes any.
                    self._batch_processor.emit(kept)

    return ErrorsKept()
