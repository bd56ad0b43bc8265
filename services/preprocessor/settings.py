"""Preprocessor settings (`SY_*`)."""

from __future__ import annotations

from pydantic import Field

from switchyard.config import Settings


class PreprocessorSettings(Settings):
    # Pool that serves OpenAI-style chat from `llm.in.<tenant>`.
    chat_pool: str = Field(default="llm", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # Messages in flight per ingress consumer.
    concurrency: int = Field(default=32, ge=1, le=4096)
    ingress_ack_wait: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
