"""The overhead run: what each router adds over calling one sim server straight.

Columns, all fed the same short chat requests (non-streaming, a few output tokens, the
`sim` engine at zero delay so the backend costs next to nothing):

  a. `direct`: one `sy sim-server`;
  b. `vllm-router`: vLLM's router (its default policy, cache_aware) over that sim server;
  c. `smg`: SGLang's gateway (`smg launch`, its default cache_aware policy) over it;
  d. `switchyard edge`: HTTP edge -> REQ (its record on INGRESS) -> router -> one sim worker;
  e. `switchyard nats`: a `GenerateRequest` published straight onto `req.llm.<tenant>`
     (the router's input) and its token stream read back - Switchyard without HTTP;
  f. `switchyard edge, traced R` (one per `trace_samples` ratio): column d on a fleet of
     its own with OpenTelemetry on, head-sampling R of the requests, exporting to an
     OTLP sink (`otlpsink`) - what tracing adds, beside column d without it.

Every process is its own OS process on this machine, the load generator too (one asyncio
client, shared by all columns). Columns run interleaved in blocks (`rounds`).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from switchyard import eventloop
from switchyard.bench.engine import numbered_messages
from switchyard.bench.peers import peers, simfleet
from switchyard.bench.peers.clients import Outcome, http_chat, nats_generate
from switchyard.bench.peers.cpu import CpuMeter
from switchyard.bench.peers.rounds import Send, interleave
from switchyard.bench.peers.stats import Latency
from switchyard.bench.peers.syfleet import KEY, POOL, TENANT, switchyard_fleet
from switchyard.bench.stats import Report
from switchyard.fleet import FleetError, ProcessGroup
from switchyard.messages.inference import ChatMessage, GenerateRequest, Sampling
from switchyard.otel import SAMPLE_RATIO
from switchyard.ports import free_port

DIRECT, VLLM, SMG, SY_EDGE, SY_NATS = (
    "direct sim-server", "vllm-router", "smg", "switchyard edge", "switchyard nats",
)  # fmt: skip
COLUMNS = (DIRECT, VLLM, SMG, SY_EDGE, SY_NATS)


@dataclass(frozen=True)
class OverheadConfig:
    requests: int = 2000  # per column
    concurrency: int = 8
    block: int = 200
    max_tokens: int = 8
    warmup: int = 50
    tls: bool = False  # NATS over TLS with client certificates, as in production
    trace_samples: tuple[float, ...] = ()  # a traced edge column per head-sampling ratio


@dataclass(frozen=True)
class OverheadColumn:
    latency: Latency
    rps: float
    added_p50_ms: float  # over the direct column
    added_p99_ms: float
    errors: int
    first_error: str | None
    hops_p50_ms: dict[str, float] | None = None  # Switchyard: median per hop
    # CPU milliseconds per request, per process (the load generator included), measured
    # while this column ran alone; processes idle meanwhile show their background cost.
    cpu_ms_per_request: dict[str, float] | None = None


@dataclass(frozen=True)
class OverheadResult(Report):
    config: OverheadConfig
    columns: dict[str, OverheadColumn]
    wall_s: float


def traced(ratio: float) -> str:
    return f"{SY_EDGE}, traced {ratio:.0%}"


def _body(i: int, max_tokens: int) -> dict[str, object]:
    return {"model": simfleet.MODEL, "messages": numbered_messages(i), "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip


async def _measure(cfg: OverheadConfig, log_dir: Path) -> OverheadResult:
    started = time.perf_counter()
    with ProcessGroup(log_dir / "overhead") as group:
        (backend,) = simfleet.start_sim_servers(group, 1, delay_scale=0.0)
        routers: dict[str, str] = {}
        for column, peer in ((VLLM, peers.VLLM_ROUTER), (SMG, peers.SMG)):
            cmd = peers.command(peer, [backend], "cache_aware")
            await peers.start(group, cmd)
            routers[column] = cmd.url
        async with contextlib.AsyncExitStack() as stack:
            fleet = await stack.enter_async_context(switchyard_fleet(
                log_dir / "overhead", workers=1, delay_scale=0.0, edge=True, tls=cfg.tls
            ))  # fmt: skip
            edges = {SY_EDGE: fleet.edge_url}
            if cfg.trace_samples:
                port = free_port()
                sink = f"http://127.0.0.1:{port}"
                argv = [sys.executable, "-m", "switchyard.bench.peers.otlpsink", str(port)]
                group.wait_http(group.start("otlp-sink", argv), sink, timeout=30)
            for ratio in cfg.trace_samples:
                env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink, SAMPLE_RATIO: str(ratio)}
                traced_fleet = await stack.enter_async_context(switchyard_fleet(
                    log_dir / f"overhead-traced-{ratio}", workers=1, delay_scale=0.0,
                    edge=True, tls=cfg.tls, env=env,
                ))  # fmt: skip
                edges[traced(ratio)] = traced_fleet.edge_url
            if None in edges.values():
                raise FleetError("a Switchyard fleet was started without its edge")
            # A connection idle while the other columns ran is dropped before the servers'
            # own keep-alive timeout (uvicorn's is 5 s, httpx's default too): reusing one
            # the server is closing at that moment fails the request (`ReadError`).
            limits = httpx.Limits(max_connections=cfg.concurrency * 2, keepalive_expiry=2.0)
            clients = {
                DIRECT: httpx.AsyncClient(base_url=backend, limits=limits, timeout=60),
                **{c: httpx.AsyncClient(base_url=u, limits=limits, timeout=60)
                   for c, u in routers.items()},
                **{c: httpx.AsyncClient(base_url=str(u), limits=limits, timeout=60,
                                        headers={"Authorization": f"Bearer {KEY}"})
                   for c, u in edges.items()},
            }  # fmt: skip

            def over_http(column: str) -> Send:
                http = clients[column]
                model = "default" if column in edges else simfleet.MODEL

                async def send(i: int) -> Outcome:
                    body = _body(i, cfg.max_tokens) | {"model": model}
                    return await http_chat(http, body)

                return send

            async def over_nats(i: int) -> Outcome:
                req = GenerateRequest(
                    tenant=TENANT, workload="llm", pool=POOL,
                    messages=[ChatMessage.model_validate(m) for m in numbered_messages(i)],
                    sampling=Sampling(max_tokens=cfg.max_tokens, temperature=0.0),
                    prompt_tokens=32, deadline=time.time() + 60,
                    stream=False,  # the workload of the HTTP columns: one answer, no deltas
                )  # fmt: skip
                return await nats_generate(fleet.bus, req, timeout=60)

            columns: dict[str, Send] = {c: over_http(c) for c in (DIRECT, VLLM, SMG, *edges)}
            columns[SY_NATS] = over_nats
            try:
                records = await interleave(
                    columns, per_column=cfg.requests, block=cfg.block,
                    concurrency=cfg.concurrency, warmup=cfg.warmup, meter=CpuMeter().snapshot,
                )  # fmt: skip
            finally:
                for http in clients.values():
                    await http.aclose()
    base = Latency.of([o.total_s for o in records[DIRECT].outcomes])
    out: dict[str, OverheadColumn] = {}
    for name in (*COLUMNS, *map(traced, cfg.trace_samples)):
        rec = records[name]
        lat = Latency.of([o.total_s for o in rec.outcomes])
        out[name] = OverheadColumn(
            latency=lat, rps=round(rec.rps, 1),
            added_p50_ms=round(lat.p50_ms - base.p50_ms, 3),
            added_p99_ms=round(lat.p99_ms - base.p99_ms, 3),
            errors=len(rec.errors), first_error=rec.errors[0] if rec.errors else None,
            hops_p50_ms=_hops_p50(rec.outcomes),
            cpu_ms_per_request=rec.cpu_ms_per_request(),
        )  # fmt: skip
    return OverheadResult(cfg, out, round(time.perf_counter() - started, 1))


def _hops_p50(outcomes: list[Outcome]) -> dict[str, float] | None:
    hops = [o.hops for o in outcomes if o.hops]
    if not hops:
        return None
    return {k: round(statistics.median(h[k] for h in hops) * 1000, 2) for k in hops[0]}


def run_overhead(cfg: OverheadConfig, log_dir: Path) -> OverheadResult:
    return eventloop.run(_measure(cfg, log_dir))
