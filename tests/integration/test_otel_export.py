"""OpenTelemetry export from a real fleet (edge, router, `sim` worker, in process) to a real
OTLP/HTTP receiver: the SDK's protobuf export decoded with `opentelemetry-proto`, one span
tree under the client's trace, and the same hops as `sy trace` shows for the request."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from switchyard import otel
from switchyard.bus.connection import Bus
from switchyard.forensics.trace import find
from switchyard.tracing import trace_id
from tests.integration import test_trace as traced
from tests.support.poll import until

# Its own trace id per run: `sy trace` joins requests by trace id, across tests too.
CLIENT = f"00-{os.urandom(16).hex()}-b7ad6b7169203331-01"


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start: float  # Unix seconds
    end: float
    error: bool


class Receiver:
    """An OTLP/HTTP traces endpoint (`POST /v1/traces`, protobuf), keeping what it got."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.content_types: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.took(self.path, self.headers.get("Content-Type", ""), body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def took(self, path: str, content_type: str, body: bytes) -> None:
        assert path == "/v1/traces", path
        self.content_types.add(content_type)
        export = ExportTraceServiceRequest.FromString(body)
        for resource in export.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for s in scope.spans:
                    self.spans.append(Span(
                        attrs["service.name"], s.name, s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), s.start_time_unix_nano / 1e9,
                        s.end_time_unix_nano / 1e9, s.status.code == s.status.STATUS_CODE_ERROR,
                    ))  # fmt: skip

    def of(self, trace: str) -> dict[str, Span]:
        return {s.name: s for s in self.spans if s.trace_id == trace}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """Tracing on for the services started in the test, all sampled, exported at once."""
    got = Receiver()
    threading.Thread(target=got.server.serve_forever, daemon=True).start()
    otel.shutdown()  # tracers made under an earlier test's environment
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", got.url)
    monkeypatch.setenv(otel.SAMPLE_RATIO, "1")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    try:
        yield got
    finally:
        otel.shutdown()
        got.server.shutdown()


# Where each hop `sy trace` shows happened in the OTel trace: in which span, and at which
# of its ends when the span was laid out from that very stamp (None: anywhere inside it).
HOME: dict[str, tuple[str, str | None]] = {
    "created": ("edge", None),
    "prepared": ("edge", None),  # the edge prepares its chat itself
    "stored": ("edge", None),
    "admitted": ("router.admit", "end"),
    "dispatched": ("router.queue", "end"),
    "started": ("worker.prefill", "start"),
    "first token": ("worker.decode", "start"),
    "finished": ("worker.decode", "end"),
    "result stored": ("worker", None),
}
PARENT = {
    "router": "edge", "router.admit": "router", "router.queue": "router",
    "router.dispatch": "router", "worker": "router", "worker.queue": "worker",
    "worker.prefill": "worker", "worker.decode": "worker",
}  # fmt: skip
CLOCKS = 0.005  # s: the stream stamps are nats-server's clock, the spans this process's


async def test_a_request_through_the_fleet_is_one_exported_span_tree(
    bus: Bus, nats_url: str, tmp_path: Path, unique: str, receiver: Receiver
) -> None:
    pool = f"ot{unique}"
    async with (
        traced.sim_fleet_with_edge(bus, nats_url, tmp_path, pool) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        resp = await http.post(
            "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Hi."}],
                  "max_tokens": 8},
            headers={"Authorization": "Bearer sk-trace", "traceparent": CLIENT},
        )  # fmt: skip
        assert resp.status_code == 200, resp.text
        request_id = resp.headers["x-request-id"]
        tid = trace_id(CLIENT)
        assert tid is not None
        await until(
            lambda: set(PARENT) | {"edge"} <= set(receiver.of(tid)),
            timeout=20,
            what="the spans of every hop exported",
        )

    spans = receiver.of(tid)
    assert receiver.content_types == {"application/x-protobuf"}
    assert set(spans) == set(PARENT) | {"edge"}
    # One tree: the edge under the client's span, each hop under the one that sent it on.
    assert spans["edge"].parent_id == CLIENT.split("-")[2]
    for child, parent in PARENT.items():
        assert spans[child].parent_id == spans[parent].span_id, child
    for span in spans.values():
        assert span.service == span.name.split(".")[0]  # each from its own service
        assert span.start <= span.end and not span.error
    # The edge answered with its own span's context, the trace the client's.
    answered = resp.headers["traceparent"]
    assert answered.startswith(f"00-{tid}-{spans['edge'].span_id}-")
    assert int(answered[-2:], 16) & 1  # sampled, as the client asked

    # `sy trace` rebuilds the same hops from the streams: each lies in its span.
    trace = await find(bus.js, request_id, window=60)
    assert trace.trace_id == tid
    assert [h.name for h in trace.ordered()] == list(HOME)
    for hop in trace.hops:
        name, end = HOME[hop.name]
        span = spans[name]
        if end is None:
            assert span.start - CLOCKS <= hop.at <= span.end + CLOCKS, (hop, span)
        else:  # laid out from the very stamp the result's route carries
            assert hop.at == pytest.approx(getattr(span, end), abs=1e-6), (hop, span)
    # And every service in the OTel trace is a place `sy trace` saw the request.
    assert {HOME[h.name][0].split(".")[0] for h in trace.hops} == {
        s.service for s in spans.values()
    }
