"""The state one sim server holds: its engine, what it served, and the modelled timings."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict

from switchyard.engines.sim import SimEngine, SimSettings, SimTimings

# Modelled timings kept for `GET /sim/timings` (a benchmark reads them after its run).
TIMINGS_KEPT = 200_000


class ServedTotals:
    """What the HTTP layer saw finish: requests by reason, tokens, modelled busy time."""

    def __init__(self) -> None:
        self.finished: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.busy_seconds = 0.0

    def record(self, reason: str, prompt: int, generated: int, busy: float) -> None:
        self.finished[reason] += 1
        self.prompt_tokens += prompt
        self.generation_tokens += generated
        self.busy_seconds += busy


class SimServerState:
    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.engine = SimEngine(settings)
        self.totals = ServedTotals()
        self.finished: deque[SimTimings] = deque(maxlen=TIMINGS_KEPT)

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

    def record(self, request_id: str, reason: str) -> None:
        t = self.engine.timings(request_id)
        if t is not None:
            self.totals.record(reason, t.prompt_tokens, t.completion_tokens, t.gpu)
            self.finished.append(t)

    def timings_json(self) -> list[dict[str, object]]:
        return [asdict(t) for t in self.finished]
