"""The agent's latency budget: how many output tokens a step SLO allows.

A step is one request/response: fixed costs (network, image preprocessing,
routing, parsing), then TTFT (queue + prefill + first token), then TPOT per
further token ([S2] §2):

    step(O)  = fixed + TTFT + TPOT × (O − 1)
    O_max    = floor((SLO − fixed − TTFT) / TPOT) + 1      (0 if SLO < fixed + TTFT)

For the agent, output length dominates: every extra token costs a whole TPOT,
which is why actions are short, schema-constrained JSON (ARCHITECTURE.md, Design rules).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class StepLatency(BaseModel):
    """The three costs of a step, in milliseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_ms: float = Field(ge=0)
    ttft_ms: float = Field(ge=0)
    tpot_ms: float = Field(gt=0)

    def step_ms(self, output_tokens: int) -> float:
        """Latency of a step that emits `output_tokens` (≥ 1) tokens."""
        if output_tokens < 1:
            raise ValueError(f"a step emits at least one token, got {output_tokens}")
        return self.fixed_ms + self.ttft_ms + self.tpot_ms * (output_tokens - 1)

    def max_output_tokens(self, slo_ms: float) -> int:
        """Largest output length whose step meets `slo_ms` (0: even one token misses it)."""
        room = slo_ms - self.fixed_ms - self.ttft_ms
        if room < 0:
            return 0
        return math.floor(room / self.tpot_ms + 1e-9) + 1
