"""Edge settings (`SY_*`): where the API keys live, the HTTP port (HTTPS with a
certificate), and request caps."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from switchyard.config import Settings
from switchyard.messages.agent import MAX_FRAME_BYTES
from switchyard.messages.sql import IDLE_TIMEOUT

SUBJECT_TOKEN = r"^[A-Za-z0-9_-]{1,64}$"  # noqa: S105 - a regex, not a secret


class EdgeSettings(Settings):
    service_name: ClassVar[str] = "edge"

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # YAML: `keys: {<sha256 hex of the key>: {tenant, models?, pools?}}`. No file = no keys,
    # so every request is refused with 401 rather than served as some default tenant.
    api_keys_file: Path | None = None
    # The key file is read again when it changes (checked at most this often, on a
    # request): a key added or removed works or stops working without a restart.
    api_keys_reload_interval: float = Field(default=2.0, gt=0, le=3600)
    # HTTPS: a PEM certificate (chain) and its key; both unset = plain HTTP (behind a
    # proxy that terminates TLS, or local development).
    https_cert: Path | None = None
    https_key: Path | None = None
    # Strict-Transport-Security on every HTTPS response (never on plain HTTP, where a
    # browser ignores it); 0 leaves it out. Start low when first turning HTTPS on.
    hsts_max_age: int = Field(default=365 * 24 * 3600, ge=0)
    # Models clients may name (listed by /v1/models); a key may narrow this further.
    models: list[str] = ["default"]
    chat_pool: str = Field(default="llm", pattern=SUBJECT_TOKEN)
    agent_pool: str = Field(default="agent", pattern=SUBJECT_TOKEN)
    # Request caps, checked before anything reaches the bus.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # `POST /v1/agent/step` carries frames: its own body cap, and a per-frame byte cap
    # (never above the bus's per-frame cap). Pixel caps are the preprocessor's.
    max_agent_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_frame_bytes: int = Field(default=MAX_FRAME_BYTES, ge=1024, le=MAX_FRAME_BYTES)
    # An agent step's deadline (published; the router answers `expired` -> 504).
    agent_timeout: float = Field(default=30.0, gt=0, le=3600)
    # `POST /v1/sql/ask`: the pool a key needs; the question's deadline (to be started by,
    # and its model calls' deadline: a CPU model may need a minute for one statement);
    # the longest silence from the orchestrator, whose keepalives (every
    # `keepalive_interval`, 5 s) make a silence that long an orchestrator gone.
    sql_pool: str = Field(default="sql", pattern=SUBJECT_TOKEN)
    sql_timeout: float = Field(default=120.0, gt=0, le=3600)
    sql_idle_timeout: float = Field(default=IDLE_TIMEOUT, gt=0, le=3600)
    max_messages: int = Field(default=256, ge=1, le=256)
    max_message_chars: int = Field(default=128 * 1024, ge=1, le=256 * 1024)
    max_tokens_cap: int = Field(default=4096, ge=1, le=32768)
    default_max_tokens: int = Field(default=256, ge=1, le=32768)
    # Whole-request deadline (published as the envelope deadline) and silence limit.
    request_timeout: float = Field(default=120.0, gt=0, le=3600)
    idle_timeout: float = Field(default=60.0, gt=0)
    # How long a stream waits for its first frame before committing to a 200 SSE
    # response: router refusals arrive within milliseconds and then become real
    # HTTP statuses (429, 403...), while a queued request starts streaming heartbeats.
    first_frame_grace: float = Field(default=1.0, ge=0)
    sse_heartbeat: float = Field(default=10.0, gt=0)
    # How long a retry with an Idempotency-Key waits for a running original.
    idempotency_wait: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _https_pair(self) -> EdgeSettings:
        if (self.https_cert is None) != (self.https_key is None):
            raise ValueError("set SY_HTTPS_CERT and SY_HTTPS_KEY together")
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.https_cert is not None else "http"

    def uvicorn_tls(self) -> dict[str, Any]:
        """uvicorn's TLS arguments: the certificate and key, or none (plain HTTP)."""
        if self.https_cert is None or self.https_key is None:
            return {}
        return {"ssl_certfile": str(self.https_cert), "ssl_keyfile": str(self.https_key)}
