"""Sqlflow settings (`SY_*`): where knowledge and policies live, and the pipeline's knobs.

No signing key and no database settings on purpose: the orchestrator can only ask
the validator and the executor.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from switchyard.config import Settings
from switchyard.messages.sql import KEEPALIVE_INTERVAL
from switchyard.text2sql.pipeline import FlowOptions


class SqlflowSettings(Settings, FlowOptions):
    """The service's own settings; the pipeline's knobs (`FlowOptions`) come with it."""

    service_name: ClassVar[str] = "sqlflow"
    knowledge_dir: Path = Path("deploy/knowledge")
    # Qdrant: embedded at this path by default; a server when `qdrant_url` is set.
    knowledge_index: Path = Path(".sy/knowledge-index")
    qdrant_url: str | None = None
    # Read only, for the tenant's grammar and views (the validator holds the key).
    sql_policy_dir: Path = Path(".sy/sql-policies")
    sql_pool: str = Field(default="sql", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    sql_model: str = "default"
    # The tenant LoRA adapter name, when the `sql` pool serves one (vLLM).
    sql_lora: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    concurrency: int = Field(default=8, ge=1, le=1024)
    ingress_ack_wait: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    model_idle_timeout: float = Field(default=60.0, gt=0)
    # A `StageProgress` on the asker's reply inbox every this many seconds while a question
    # is worked on: askers' idle timeouts (`messages.sql.IDLE_TIMEOUT`, 30 s, by default)
    # count on several of them, so raising it means raising those.
    keepalive_interval: float = Field(default=KEEPALIVE_INTERVAL, gt=0, le=60)
    guard_timeout: float = Field(default=20.0, gt=0)
    drain_timeout: float = Field(default=30.0, gt=0)

    def flow_options(self) -> FlowOptions:
        return FlowOptions(**self.model_dump(include=set(FlowOptions.model_fields)))
