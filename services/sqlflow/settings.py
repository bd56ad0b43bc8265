"""Sqlflow settings (`SY_*`): where knowledge and policies live, and the pipeline's knobs.

No signing key and no database settings on purpose: the orchestrator can only ask
the validator and the executor.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from switchyard.config import Settings
from switchyard.messages.sql import KEEPALIVE_INTERVAL
from switchyard.text2sql.grammar import GRAMMAR_VIEWS, MAX_GRAMMAR_VIEWS
from switchyard.text2sql.matching import SEMANTIC_THRESHOLD, VERIFIED_THRESHOLD
from switchyard.text2sql.pipeline import FlowOptions


class SqlflowSettings(Settings):
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

    # --- the pipeline (see switchyard.text2sql.pipeline) ---
    # Cosines a stored question needs, besides the same specifics (text2sql.matching).
    verified_threshold: float = Field(default=VERIFIED_THRESHOLD, gt=0, le=1)
    semantic_cache: bool = False
    semantic_threshold: float = Field(default=SEMANTIC_THRESHOLD, gt=0, le=1)
    # Off (SY_GENERATION=false): only verified queries and metrics answer; any other
    # question gets the nearest of them offered back, and no model writes SQL.
    generation: bool = True
    # "auto": the whole schema when it fits `context_budget_tokens`, retrieval otherwise.
    scope: Literal["auto", "full", "retrieval"] = "auto"
    context_budget_tokens: int = Field(default=1200, ge=64)
    retrieval_views: int = Field(default=4, ge=1, le=64)
    # The most views the generation grammar covers: those the question needs
    # (switchyard.text2sql.grammar.choose_views); its size grows with their joins.
    grammar_views: int = Field(default=GRAMMAR_VIEWS, ge=1, le=MAX_GRAMMAR_VIEWS)
    few_shots: int = Field(default=2, ge=0, le=16)
    sql_max_tokens: int = Field(default=200, ge=16, le=4096)
    summary: bool = True
    summary_max_tokens: int = Field(default=60, ge=8, le=1024)
    # Who writes the summary (SY_SUMMARY_SOURCE). "template": a sentence from the
    # result's facts, exact and in microseconds; the default, because the CPU model
    # needs ~7 s for one sentence (longer than the rest of the answer). "model": the
    # model rephrases it (a GPU model, e.g. Qwen2.5-7B); a rephrasing that states a
    # number, date or name not among the facts is replaced by the template sentence.
    summary_source: Literal["template", "model"] = "template"
    # Off: the summary model sees the result's shape and aggregates, never its rows.
    rows_to_model: bool = False
    exact_cache_ttl: float = Field(default=300.0, ge=0)
    result_cache_ttl: float = Field(default=60.0, ge=0)

    def flow_options(self) -> FlowOptions:
        names = FlowOptions.__dataclass_fields__
        return FlowOptions(**{n: getattr(self, n) for n in names if hasattr(self, n)})
