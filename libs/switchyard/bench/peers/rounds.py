"""Interleaved measurement: columns take turns in short blocks, in a rotating order.

Each round runs one block of every column, one column at a time, at the same fixed
concurrency; the order rotates each round, so slow phases of the machine (another
process's burst, a GC, thermal) are spread over every column alike. A column's latency
is pooled over its blocks; its throughput is the median of its blocks' requests/s, each
measured while it ran alone at that concurrency. With a `meter` (CPU seconds per
process, `cpu.CpuMeter.snapshot`), each block's CPU time is booked to its column, so a
column's CPU per request per process is measured while it ran alone too.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from switchyard.bench.peers.clients import Outcome

Send = Callable[[int], Awaitable[Outcome]]  # request index -> its outcome


@dataclass
class ColumnRecord:
    outcomes: list[Outcome] = field(default_factory=list)
    block_rps: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # per process, over its blocks
    sent: int = 0

    @property
    def rps(self) -> float:
        return statistics.median(self.block_rps) if self.block_rps else 0.0

    def cpu_ms_per_request(self) -> dict[str, float]:
        if not self.sent:
            return {}
        return {k: round(v * 1000 / self.sent, 3) for k, v in sorted(self.cpu_s.items())}


async def run_block(
    send: Send, indices: Sequence[int], concurrency: int, rec: ColumnRecord | None
) -> float:
    """Send `indices` with `concurrency` clients; requests/s of the block (0 if none succeeded)."""
    queue = list(reversed(indices))
    ok = 0

    async def client() -> None:
        nonlocal ok
        while queue:
            i = queue.pop()
            try:
                outcome = await send(i)
            except Exception as e:  # counted and reported, never dropped
                if rec is not None:
                    rec.errors.append(f"{type(e).__name__}: {e}"[:300])
                continue
            ok += 1
            if rec is not None:
                rec.outcomes.append(outcome)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    took = time.perf_counter() - started
    return ok / took if took > 0 else 0.0


Meter = Callable[[], dict[str, float]]  # CPU seconds so far, per process


async def interleave(
    columns: dict[str, Send], *, per_column: int, block: int, concurrency: int, warmup: int,
    meter: Meter | None = None,
) -> dict[str, ColumnRecord]:  # fmt: skip
    names = list(columns)
    for name in names:  # warm connections, JIT-free but cache-full paths, lazy imports
        await run_block(columns[name], range(-warmup, 0), concurrency, None)
    records = {name: ColumnRecord() for name in names}
    rounds = -(-per_column // block)
    for r in range(rounds):
        lo, hi = r * block, min(per_column, (r + 1) * block)
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            rec = records[name]
            before = meter() if meter is not None else {}
            rps = await run_block(columns[name], range(lo, hi), concurrency, rec)
            rec.block_rps.append(rps)
            rec.sent += hi - lo
            if meter is not None:
                for proc, seconds in meter().items():
                    rec.cpu_s[proc] = rec.cpu_s.get(proc, 0.0) + seconds - before.get(proc, 0.0)
    return records
