"""`switchyard.otel`'s sampling rules, on the real SDK with its in-memory exporter: head
sampling decided once and carried in the traceparent's flag, every error kept."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchyard import otel
from switchyard.bench.peers.otlpsink import _Sink
from switchyard.errors import SwitchyardError
from switchyard.tracing import trace_id

SERVICES = ("edge", "router", "worker")
CLIENT_SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def sampled(traceparent: str | None) -> bool:
    """The traceparent's sampled flag (the SDK also sets W3C level 2's `random` bit)."""
    return int(str(traceparent).split("-")[3], 16) & 1 == 1


class Fleet:
    """Three services as three processes would have them: a tracer and an exporter each."""

    def __init__(self, ratio: float) -> None:
        self.exported = {name: InMemorySpanExporter() for name in SERVICES}
        self.tracers = {name: otel.build(name, self.exported[name], ratio) for name in SERVICES}
        self.sent: dict[str, str | None] = {}  # the traceparent each hop sent onward

    def request(self, fail_at: str | None = None, client: str | None = None) -> None:
        """edge -> router -> worker, each a child of what the one before sent; a failure at
        `fail_at` fails the edge's answer too, as the edge answers it with an error."""
        t = 1_700_000_000.0
        with self.tracers["edge"].hop("edge", client) as edge:
            self.sent["edge"] = edge.traceparent
            router = self.tracers["router"].begin("router", edge.traceparent, start=t)
            router.child("router.queue", t, t + 0.001)
            if fail_at == "router":
                router.fail("rejected", "over its quota")
            router.end(t + 0.002)
            self.sent["router"] = router.traceparent
            if fail_at != "router":
                with self.tracers["worker"].hop("worker", router.traceparent) as worker:
                    self.sent["worker"] = worker.traceparent
                    worker.child("worker.prefill", t + 0.003, t + 0.004)
                    worker.child("worker.decode", t + 0.004, t + 0.006)
                    if fail_at == "worker":
                        worker.fail("engine_error", "the engine died")
            if fail_at is not None:
                edge.fail("http_500", "answered 500")

    def spans(self) -> dict[str, list[ReadableSpan]]:
        for tracer in self.tracers.values():
            tracer.flush()
        return {name: list(ex.get_finished_spans()) for name, ex in self.exported.items()}

    def names(self) -> dict[str, list[str]]:
        return {k: sorted(s.name for s in v) for k, v in self.spans().items()}


ALL = {
    "edge": ["edge"],
    "router": ["router", "router.queue"],
    "worker": ["worker", "worker.decode", "worker.prefill"],
}
NONE: dict[str, list[str]] = {"edge": [], "router": [], "worker": []}


def test_at_ratio_one_every_span_is_exported_in_one_linked_tree() -> None:
    fleet = Fleet(1.0)
    fleet.request()
    assert fleet.names() == ALL
    spans = {s.name: s for group in fleet.spans().values() for s in group}
    assert len({s.context.trace_id for s in spans.values()}) == 1
    assert spans["edge"].parent is None  # no client trace: the edge's span is the root
    for child, parent in (("router", "edge"), ("worker", "router"), ("router.queue", "router"),
                          ("worker.prefill", "worker"), ("worker.decode", "worker")):  # fmt: skip
        assert spans[child].parent is not None
        assert spans[child].parent.span_id == spans[parent].context.span_id, child
    # What each hop sent onward is its own span, sampled.
    for name in SERVICES:
        ctx = spans[name].context
        assert str(fleet.sent[name]).startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
        assert sampled(fleet.sent[name])
    assert spans["router.queue"].start_time == 1_700_000_000 * 10**9  # explicit times kept


def test_at_ratio_zero_a_request_that_went_well_exports_nothing() -> None:
    fleet = Fleet(0.0)
    fleet.request()
    assert fleet.names() == NONE
    # The decision travels in the flag: every later hop agreed not to sample.
    assert not any(sampled(fleet.sent[name]) for name in SERVICES)


def test_at_ratio_zero_errors_are_kept_with_their_hop() -> None:
    fleet = Fleet(0.0)
    fleet.request(fail_at="worker")
    # The failing hop whole (its stages too) and the edge that answered the error; not the
    # router, whose hop went well and ended before the failure (the documented limit).
    assert fleet.names() == {**ALL, "router": []}
    fleet = Fleet(0.0)
    fleet.request(fail_at="router")
    assert fleet.names() == {**NONE, "edge": ["edge"], "router": ["router", "router.queue"]}


def test_an_exception_out_of_a_hop_fails_it_and_keeps_it() -> None:
    fleet = Fleet(0.0)
    with pytest.raises(RuntimeError), fleet.tracers["worker"].hop("worker", None):
        raise RuntimeError("boom")
    (span,) = fleet.spans()["worker"]
    assert span.status.description == "boom" and span.attributes["error.type"] == "RuntimeError"


def test_a_client_that_sampled_its_trace_is_followed_at_ratio_zero() -> None:
    fleet = Fleet(0.0)
    fleet.request(client=CLIENT_SAMPLED)
    assert fleet.names() == ALL
    edge = fleet.spans()["edge"][0]
    assert edge.parent is not None and edge.parent.span_id == 0x00F067AA0BA902B7
    assert trace_id(fleet.sent["worker"]) == trace_id(CLIENT_SAMPLED)


def test_between_the_two_ratios_the_share_sampled_is_about_the_ratio() -> None:
    fleet = Fleet(0.5)
    for _ in range(400):
        fleet.request()
    roots = len(fleet.spans()["edge"])
    assert 120 < roots < 280  # 200 expected; trace ids are random
    assert len(fleet.spans()["worker"]) == 3 * roots  # the hops followed the edge's choice


@pytest.mark.parametrize(("raw", "ratio"), [("", 0.1), ("0", 0.0), ("0.25", 0.25), ("1", 1.0)])
def test_the_sample_ratio_setting(raw: str, ratio: float) -> None:
    assert otel.sample_ratio({otel.SAMPLE_RATIO: raw}) == ratio


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "ten", "nan"])
def test_a_sample_ratio_out_of_range_is_refused(raw: str) -> None:
    with pytest.raises(SwitchyardError, match="SY_TRACE_SAMPLE_RATIO"):
        otel.sample_ratio({otel.SAMPLE_RATIO: raw})


@pytest.fixture
def fresh_tracers() -> Iterator[None]:
    otel.shutdown()
    yield
    otel.shutdown()


def test_without_an_endpoint_tracing_is_off_and_the_trace_passes_unchanged(
    monkeypatch: pytest.MonkeyPatch, fresh_tracers: None
) -> None:
    for name in otel.ENDPOINTS:
        monkeypatch.delenv(name, raising=False)
    tracer = otel.tracer("router")
    assert tracer is otel.OFF and not tracer.enabled
    with tracer.hop("router", CLIENT_SAMPLED) as hop:
        hop.child("router.queue", 1.0, 2.0)
        assert hop.traceparent == CLIENT_SAMPLED


def test_with_an_endpoint_the_tracer_is_on_and_made_once_per_service(
    monkeypatch: pytest.MonkeyPatch, fresh_tracers: None
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(otel.SAMPLE_RATIO, "1")
    router = otel.tracer("router")
    assert router.enabled and otel.tracer("router") is router
    assert otel.tracer("worker") is not router
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert otel.tracer("edge") is otel.OFF


def test_the_bench_sink_takes_the_sdk_s_real_export() -> None:
    """`sy bench peers overhead --trace-sample` exports to this sink: it must answer what
    the OTLP/HTTP exporter counts as a success."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        memory = Fleet(1.0)
        memory.request()
        spans = memory.spans()["worker"]
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces")
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        server.shutdown()
