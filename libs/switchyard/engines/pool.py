"""N instances of a one-sequence-at-a-time engine (llama.cpp on CPU) serving N at once.

A request goes to a free instance, preferring the one that last served its
session, so consecutive steps of an episode find their prompt prefix still in
that instance's KV cache. Requests wait in arrival order when all are busy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from switchyard.engines.base import (
    Capabilities,
    Delta,
    Engine,
    EngineKind,
    EngineRequest,
    EngineStats,
    ModelInfo,
)

_ABORTED = -1


class EnginePool:
    def __init__(self, instances: Sequence[Engine]) -> None:
        if not instances:
            raise ValueError("an engine pool needs at least one instance")
        self.instances = list(instances)
        self.kind: EngineKind = instances[0].kind
        self.capabilities: Capabilities = instances[0].capabilities
        self.slots = len(instances)  # each instance runs one sequence at a time
        self._free: list[int] = list(range(len(instances)))
        self._last_session: dict[int, str | None] = {}
        self._waiters: dict[str, asyncio.Future[int]] = {}
        self._running: dict[str, int] = {}

    async def start(self) -> None:
        for engine in self.instances:
            await engine.start()

    async def close(self) -> None:
        for engine in self.instances:
            await engine.close()

    def _pick(self, session: str | None) -> int:
        for i in self._free:
            if session is not None and self._last_session.get(i) == session:
                self._free.remove(i)
                return i
        # Prefer an instance no session is attached to, then the oldest free one.
        for i in self._free:
            if self._last_session.get(i) is None:
                self._free.remove(i)
                return i
        return self._free.pop(0)

    def _release(self, index: int) -> None:
        for request_id, waiter in list(self._waiters.items()):
            if not waiter.done():
                del self._waiters[request_id]
                waiter.set_result(index)
                return
        self._free.append(index)

    @property
    def model(self) -> ModelInfo:
        return self.instances[0].model

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        arrived = time.monotonic()
        if self._free and not self._waiters:
            index = self._pick(request.session)
        else:
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiters[request.request_id] = waiter
            try:
                index = await waiter
            except asyncio.CancelledError:
                self._waiters.pop(request.request_id, None)
                raise
            if index == _ABORTED:
                yield Delta(text="", completion_tokens=0, finish_reason="abort")
                return
        self._running[request.request_id] = index
        self._last_session[index] = request.session
        waited: float | None = time.monotonic() - arrived  # for a free instance
        try:
            async for delta in self.instances[index].generate(request):
                if waited is not None and delta.text:  # the first token's delta
                    delta = replace(delta, queued=waited + (delta.queued or 0.0))
                    waited = None
                yield delta
        finally:
            self._running.pop(request.request_id, None)
            self._release(index)

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            await self.instances[self._running[request_id]].abort(request_id)
            return
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(_ABORTED)  # it never gets a slot; its stream ends with `abort`

    def stats(self) -> EngineStats:
        parts = [e.stats() for e in self.instances]
        return EngineStats(
            kv_cache_usage=sum(p.kv_cache_usage for p in parts) / len(parts),
            kv_capacity_tokens=sum(p.kv_capacity_tokens for p in parts),
            waiting=len(self._waiters) + sum(p.waiting for p in parts),
            running=sum(p.running for p in parts),
            prefix_queried_tokens=sum(p.prefix_queried_tokens for p in parts),
            prefix_hit_tokens=sum(p.prefix_hit_tokens for p in parts),
        )
