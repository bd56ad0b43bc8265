"""Runs `prepare_frame` off the event loop, with a small cache of prepared frames.

The cache key is a digest of the raw upload: a phone sends its previous frame
again as step k+1's older frame, byte for byte, so that frame is decoded,
resized and hashed once per episode. A cached frame is only a speed-up: the
content hash comes from the pixels either way.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
from collections import OrderedDict
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

from services.preprocessor.images import FrameLimits, FrameRejected, PreparedFrame, prepare_frame
from services.preprocessor.metrics import (
    BYTES_IN,
    BYTES_OUT,
    CACHE_HITS,
    DECODE_S,
    REJECTED,
    RESIZE_S,
)


class FramePreparer:
    def __init__(self, limits: FrameLimits, procs: int, cache_size: int) -> None:
        self.limits = limits
        self._cache: OrderedDict[bytes, PreparedFrame] = OrderedDict()
        self._cache_size = cache_size
        # spawn, not fork: the parent runs asyncio and NATS threads that a fork would copy.
        self._pool: Executor = (
            ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn"))
            if procs > 0
            else ThreadPoolExecutor(1, thread_name_prefix="frames")
        )

    async def warm_up(self) -> None:
        """Start the pool's processes now, not on the first step (spawn costs ~1 s)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, prepare_frame, b"", self.limits)

    async def prepare(self, data: bytes) -> PreparedFrame | FrameRejected:
        key = hashlib.blake2b(data, digest_size=16).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            CACHE_HITS.inc()
            return cached
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(self._pool, prepare_frame, data, self.limits)
        if isinstance(out, FrameRejected):
            REJECTED.labels(out.code).inc()
            return out
        DECODE_S.observe(out.decode_s)
        RESIZE_S.observe(out.resize_s)
        BYTES_IN.inc(len(data))
        BYTES_OUT.inc(len(out.data))
        if self._cache_size:
            self._cache[key] = out
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return out

    async def prepare_all(self, frames: list[bytes]) -> list[PreparedFrame] | FrameRejected:
        """All frames of a step (oldest first), or the first rejection."""
        out = await asyncio.gather(*(self.prepare(f) for f in frames))
        for item in out:
            if isinstance(item, FrameRejected):
                return item
        return [f for f in out if isinstance(f, PreparedFrame)]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
