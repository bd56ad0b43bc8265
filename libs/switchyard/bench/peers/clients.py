"""One request, sent and timed the same way for every column.

Every client returns an `Outcome`: wall seconds from send to the first content token
(streaming only) and to the end, and what the backend said it cost. The backend is
identified by the answer itself: a sim server's completion id is ``chatcmpl-<request id>``,
which the routers pass through unchanged, so the harness can look the request's modelled
timings up on the backend afterwards (`/sim/timings`); a Switchyard result carries its
worker and modelled timings in the final frame.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.messages.inference import GenerateRequest, ModelledTimings, Route


class RequestFailed(RuntimeError):
    """A request of the benchmark got no good answer; the message says which and why."""


@dataclass(frozen=True)
class Outcome:
    total_s: float
    text: str = ""
    ttft_s: float | None = None
    backend_request_id: str | None = None  # sim server: its request id
    worker: str | None = None  # Switchyard: the worker that ran it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    modelled: ModelledTimings | None = None  # Switchyard's sim engine, from the result
    hops: dict[str, float] | None = None  # Switchyard: seconds per hop (`hops_of`)


async def http_chat(
    http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Outcome:
    """POST a chat completion; streaming bodies are read as SSE, timing the first token."""
    started = time.perf_counter()
    if not body.get("stream"):
        r = await http.post("/v1/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            raise RequestFailed(f"HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        total = time.perf_counter() - started
        hops = server_timing(r.headers.get("server-timing"))
        if hops is not None:  # the rest of the client's wait: HTTP, the edge, the client
            hops["http"] = max(0.0, total - sum(hops.values()))
        return Outcome(
            total_s=total,
            hops=hops,
            text=str(data["choices"][0]["message"]["content"]),
            backend_request_id=_request_id(data.get("id")),
            prompt_tokens=int((data.get("usage") or {}).get("prompt_tokens", 0)),
        )
    ttft: float | None = None
    rid: str | None = None
    prompt_tokens = 0
    text: list[str] = []
    done = False
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RequestFailed(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RequestFailed(f"stream error: {chunk['error']}")
            rid = rid or _request_id(chunk.get("id"))
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    text.append(content)
                    if ttft is None:
                        ttft = time.perf_counter() - started
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"].get("prompt_tokens", 0))
    if not done:
        raise RequestFailed("the stream ended without [DONE]")
    return Outcome(
        total_s=time.perf_counter() - started, text="".join(text), ttft_s=ttft,
        backend_request_id=rid,
        prompt_tokens=prompt_tokens,
    )  # fmt: skip


def _request_id(completion_id: object) -> str | None:
    if isinstance(completion_id, str) and completion_id.startswith("chatcmpl-"):
        return completion_id.removeprefix("chatcmpl-")
    return None


async def nats_generate(bus: Bus, req: GenerateRequest, timeout: float = 120.0) -> Outcome:
    """Publish onto `req.<workload>.<tenant>` (straight into the router) and read the stream."""
    started = time.perf_counter()
    ttft: float | None = None
    async with TokenStreamReader(bus.nc, idle_timeout=timeout) as reader:
        await publish(
            bus.js, subjects.req(req.workload, req.tenant),
            req.model_copy(update={"reply": reader.inbox}),
        )  # fmt: skip
        async for frame in reader:
            if frame.type == "delta" and frame.text and ttft is None:
                ttft = time.perf_counter() - started
            elif frame.type == "error":
                raise RequestFailed(f"stream error: {frame.error}")
            elif frame.type == "end":
                result = frame.result
                if result is None or result.status != "ok":
                    why = result.error if result is not None else "no result"
                    raise RequestFailed(
                        f"request {req.id} ended {getattr(result, 'status', '')}: {why}"
                    )
                ended = time.time()
                return Outcome(
                    total_s=time.perf_counter() - started,
                    text=result.text,
                    ttft_s=ttft,
                    worker=result.worker,
                    prompt_tokens=result.usage.prompt_tokens,
                    cached_tokens=result.usage.cached_tokens,
                    completion_tokens=result.usage.completion_tokens,
                    modelled=result.timings.modelled,
                    hops=hops_of(result.route, ended),
                )
    raise RequestFailed(f"request {req.id}: the stream ended without an end frame")


def hops_of(route: Route | None, ended: float) -> dict[str, float] | None:
    """Where a Switchyard request's time went (`Route.hops`), for a request that went the
    whole way (admitted, dispatched and started)."""
    if route is None or None in (route.admitted_at, route.dispatched_at, route.started_at):
        return None
    return route.hops(ended)


def server_timing(header: str | None) -> dict[str, float] | None:
    """`Server-Timing: hop;dur=<ms>, ...` (the edge's answer) as seconds per hop."""
    if not header:
        return None
    hops: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                with contextlib.suppress(ValueError):
                    hops[name] = float(value) / 1000
    return hops or None
