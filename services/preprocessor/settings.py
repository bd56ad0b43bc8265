"""Preprocessor settings (`SY_*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.preprocessor.layout import LayoutChoice, window_fits
from switchyard.agentprompt import DEFAULT_LAYOUT, DEFAULT_WINDOW, MAX_WINDOW, AgentLayout
from switchyard.config import Settings
from switchyard.envelope import TenantId
from switchyard.vlmgeometry import DEFAULT_VLM, VlmName


class TenantLayout(BaseModel):
    """A tenant's own prompt layout and window, where it differs from the pool's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layout: AgentLayout | None = None
    window: int | None = Field(default=None, ge=1, le=MAX_WINDOW)


class PreprocessorSettings(Settings):
    # Pool that serves OpenAI-style chat from `llm.in.<tenant>`.
    chat_pool: str = Field(default="llm", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # Messages in flight per ingress consumer.
    concurrency: int = Field(default=32, ge=1, le=4096)
    ingress_ack_wait: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)

    # --- agent path (`agent.in.>` -> `req.agent.<tenant>`) ---
    agent_pool: str = Field(default="agent", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # Processes that decode and resize frames; 0 = a thread (tests, tiny boxes).
    frame_procs: int = Field(default=2, ge=0, le=256)
    max_frame_bytes: int = Field(default=3 * 1024 * 1024, ge=1024)
    # Decompression-bomb wall: a header announcing more pixels is refused undecoded.
    max_decode_pixels: int = Field(default=4096 * 4096, ge=1)
    # The model's pixel budget per frame (720p-class; 1080p -> 720p cuts visual tokens 56 %).
    max_pixels: int = Field(default=1280 * 720, ge=28 * 28)
    # The pool's VLM (`switchyard.vlmgeometry`): frames are resized to whole visual tokens
    # of its size, the prompt states its coordinates, and the worker maps them back with
    # it. Qwen3-VL (the seeds' Qwen3-VL-8B: 32 px, relative 0-1000) by default; a
    # Qwen2.5-VL pool (28 px, resized-frame pixels) sets qwen2.5-vl.
    agent_vlm: VlmName = DEFAULT_VLM
    frame_format: Literal["jpeg", "png", "webp"] = "jpeg"
    # Prepared frames remembered by raw-bytes digest: a step's previous frame was
    # the step before's current frame, so it is decoded once per episode, not twice.
    frame_cache: int = Field(default=256, ge=0)
    # The most max_tokens a step may ask for. What its action format and chunk need
    # (`agentactions.answer_token_budget`) is always granted, so an answer is never cut.
    agent_max_tokens: int = Field(default=64, ge=8, le=512)
    allow_thought: bool = True

    # --- prompt layout (switchyard.agentprompt): the pool's, and tenants' own ---
    agent_layout: AgentLayout = DEFAULT_LAYOUT
    # W: frames a `window` prompt holds before it compacts. A vLLM worker of the pool must
    # accept that many images per prompt (SY_VLLM_LIMIT_MM_PER_PROMPT='{"image": W}').
    agent_window: int = Field(default=DEFAULT_WINDOW, ge=1, le=MAX_WINDOW)
    # Per tenant, e.g. SY_AGENT_TENANT_LAYOUTS='{"acme": {"layout": "window", "window": 4}}'.
    # Here and not in the router's tenant policy file: the preprocessor alone lays out
    # prompts, and whether a window fits a message depends on its frame settings.
    agent_tenant_layouts: dict[TenantId, TenantLayout] = {}
    # Window frames this replica keeps in memory besides KV `agent_windows` (MiB): a
    # session's next step, when it comes back here, reads its window without the bus.
    agent_window_cache_mb: int = Field(default=256, ge=0)

    def layout_for(self, tenant: str) -> LayoutChoice:
        own = self.agent_tenant_layouts.get(tenant)
        if own is None:
            return LayoutChoice(self.agent_layout, self.agent_window)
        return LayoutChoice(own.layout or self.agent_layout, own.window or self.agent_window)

    def window_problem(self, limit: int) -> str | None:
        """Why some tenant's window (or the pool's) cannot fit `limit`-byte messages, or None."""
        choices = {"the pool": LayoutChoice(self.agent_layout, self.agent_window)}
        choices |= {f"tenant {t}": self.layout_for(t) for t in self.agent_tenant_layouts}
        for who, c in choices.items():
            if c.layout == "window":
                problem = window_fits(c.window, self.max_pixels, self.frame_format, limit)
                if problem is not None:
                    return f"{who}: {problem}"
        return None

    @model_validator(mode="after")
    def _windows_fit(self) -> PreprocessorSettings:
        problem = self.window_problem(self.max_message_bytes)
        if problem is not None:
            raise ValueError(problem)
        return self
