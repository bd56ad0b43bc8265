"""The worker's probes (`switchyard.probes`), beside the service's own (NATS connected,
not stopping):

- `/startupz`: the engine has loaded *and answered one request* (`warm_up`): loaded
  weights are not yet serving (vLLM compiles and captures CUDA graphs, llama.cpp pages its
  weights in, on their first requests), and a worker that heartbeats before it can answer
  is sent work it then holds for minutes.
- `/readyz`: started, and its engine not dead (the worker is leaving: `EngineDead`).
- `/healthz`: the engine makes progress. While it holds requests, each `liveness_stall`
  seconds bring a token or a request's end (`Runner.stalled_for`); an idle engine is live.
  A hung engine keeps its heartbeat (the loop around it runs) and the router's credit, so
  only a restart frees its requests for the partitions' next owner.
"""

from __future__ import annotations

import time

from services.worker.runner import Runner
from switchyard.engines.base import Engine, EngineError, EngineRequest
from switchyard.messages.inference import ChatMessage, Sampling
from switchyard.probes import Probes

# One token of a one-line chat: the smallest request that runs the whole path
# (template, prefill, sampling, detokenizing), on every engine.
WARM_UP = EngineRequest(
    request_id="worker-warm-up",
    messages=(ChatMessage(role="user", content="Say OK."),),
    sampling=Sampling(max_tokens=1, temperature=0.0),
)


async def warm_up(engine: Engine) -> float:
    """Run `WARM_UP` on the started `engine` to its end; returns the seconds it took.
    Raises `EngineError` when the engine cannot answer it."""
    started = time.monotonic()
    finish = None
    async for delta in engine.generate(WARM_UP):
        finish = delta.finish_reason or finish
    if finish not in ("stop", "length"):
        raise EngineError(f"the engine did not answer its warm-up request (ended: {finish})")
    return time.monotonic() - started


class WorkerHealth:
    """What the worker's probes read, set by `run_worker` as it starts."""

    def __init__(self, probes: Probes, liveness_stall: float) -> None:
        self.liveness_stall = liveness_stall
        self.starting: str | None = "loading the engine"  # why it has not started yet
        self.runner: Runner | None = None
        probes.add("startupz", "engine", lambda: self.starting)
        probes.add("readyz", "engine", self._ready)
        probes.add("healthz", "engine", self._live)

    def serving(self, runner: Runner) -> None:
        """The engine answered its warm-up; `runner` runs requests on it from now."""
        self.runner = runner
        self.starting = None

    def _ready(self) -> str | None:
        if self.starting is not None:
            return self.starting
        dead = self.runner.dead if self.runner is not None else None
        return None if dead is None else f"the engine died: {dead.reason}"

    def _live(self) -> str | None:
        if self.runner is None:  # starting: /startupz says how far
            return None
        stalled = self.runner.stalled_for()
        if stalled < self.liveness_stall:
            return None
        return (
            f"the engine made no progress for {stalled:.1f} s while holding "
            f"{len(self.runner.running)} request(s) (SY_LIVENESS_STALL={self.liveness_stall:g})"
        )
