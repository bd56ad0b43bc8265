"""Preprocessor settings (`SY_*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from switchyard.config import Settings


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
    frame_format: Literal["jpeg", "png", "webp"] = "jpeg"
    # Prepared frames remembered by raw-bytes digest: a step's previous frame was
    # the step before's current frame, so it is decoded once per episode, not twice.
    frame_cache: int = Field(default=256, ge=0)
    # Hard cap on an agent answer's tokens, whatever the step asks for.
    agent_max_tokens: int = Field(default=64, ge=8, le=512)
    allow_thought: bool = True
