"""The state one sim server holds: its engine, what it served, and the modelled timings."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict

from switchyard.engines.sim import SimEngine, SimSettings, SimTimings
from switchyard.simserver.metrics import ServedTotals

# Modelled timings kept for `GET /sim/timings` (a benchmark reads them after its run).
TIMINGS_KEPT = 200_000


class SimServerState:
    def __init__(self, settings: SimSettings, model: str) -> None:
        self.settings = settings
        self.model = model
        self.engine = SimEngine(settings)
        self.totals = ServedTotals()
        self.finished: deque[SimTimings] = deque(maxlen=TIMINGS_KEPT)

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def reset(self) -> None:
        """A cold engine (empty prefix cache, virtual clock at 0) and zeroed totals.

        For benchmarks that compare routers on the same backends: every run starts cold
        without restarting the process.
        """
        old, self.engine = self.engine, SimEngine(self.settings)
        await old.close()
        await self.engine.start()
        self.totals = ServedTotals()
        self.finished.clear()

    def record(self, request_id: str, reason: str) -> SimTimings | None:
        t = self.engine.timings(request_id)
        if t is None:
            return None
        self.totals.record(reason, t.prompt_tokens, t.completion_tokens, t.gpu)
        self.finished.append(t)
        return t

    def timings_json(self) -> list[dict[str, object]]:
        return [asdict(t) for t in self.finished]
