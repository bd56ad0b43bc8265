"""Text2SQL messages: the question, validator and executor services, stage events."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from switchyard.envelope import Envelope, Model, RequestId, ShortText, TenantId, Text
from switchyard.messages.inference import ErrorInfo

SqlText = Annotated[str, StringConstraints(min_length=1, max_length=64 * 1024)]
Signature = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# A rule id of the SQL guard or executor, e.g. "table.not_allowed" (switchyard.sqlguard.rules).
RuleId = Annotated[str, StringConstraints(pattern=r"^[a-z_]+\.[a-z_]+$", max_length=64)]
Cell = str | int | float | bool | None


class SqlAsk(Envelope):
    """A tenant's question, on `sql.in.<tenant>`.

    With `fix_sql`, the question is what the tenant meant and `fix_sql` their own
    SQL: the answer is that SQL validated, or corrected once and validated.
    Stage events go to `reply` as they happen; the answer to `res.sql.<tenant>`
    and, last, to `reply`.
    """

    kind: Literal["sql.ask"] = "sql.ask"
    question: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    database: ShortText | None = None
    max_rows: int = Field(default=1000, ge=1, le=100_000)
    fix_sql: SqlText | None = None
    # Skip the exact, semantic and result caches (fresh data, or an evaluation).
    no_cache: bool = False


class ValidateRequest(Envelope):
    """Request on `svc.sql.validate`: is this SQL allowed for this tenant?"""

    kind: Literal["sql.validate"] = "sql.validate"
    sql: SqlText
    database: ShortText
    question: Text | None = None  # for the audit trail only


class ValidateReply(Envelope):
    kind: Literal["sql.validated"] = "sql.validated"
    request_id: RequestId
    ok: bool
    canonical_sql: SqlText | None = None
    policy_version: ShortText | None = None
    signature: Signature | None = None
    checks: Annotated[list[ShortText], Field(max_length=64)] = []
    tables: Annotated[list[ShortText], Field(max_length=256)] = []
    limit_action: Literal["injected", "clamped"] | None = None
    # A rejection: which rule, on which part of the statement (error.reason says why).
    rule: RuleId | None = None
    node: ShortText | None = None
    error: ErrorInfo | None = None


class ExecuteRequest(Envelope):
    """Request on `svc.sql.execute`: canonical SQL signed by the validator.

    `signature` may be absent so an unsigned request is refused (and audited) by the
    executor with a reason, rather than dropped by the decoder."""

    kind: Literal["sql.execute"] = "sql.execute"
    canonical_sql: SqlText
    database: ShortText
    policy_version: ShortText
    signature: Signature | None = None
    max_rows: int = Field(default=1000, ge=1, le=100_000)
    # The EXPLAIN gate even where the executor's default (`sql_explain_gate`) is off:
    # model-written SQL always passes it. A request can add the gate, never remove it.
    gate: bool = False


class ExecuteReply(Envelope):
    kind: Literal["sql.rows"] = "sql.rows"
    request_id: RequestId
    ok: bool
    columns: Annotated[list[ShortText], Field(max_length=512)] = []
    rows: Annotated[list[list[Cell]], Field(max_length=100_000)] = []
    truncated: bool = False
    rows_examined: int | None = None
    rows_estimated: int | None = None
    # The EXPLAIN gate's plan and estimate, when it ran; `gate_passed`: it accepted the
    # plan, so a failure is the run's. Without it a refusal came at or before the gate.
    plan: Annotated[list[dict[str, Any]], Field(max_length=64)] = []
    gate_passed: bool = False
    duration: float = 0.0  # the whole decision, seconds
    db_duration: float | None = None  # the statement alone, in the database
    killed: bool = False
    kill_reason: ShortText | None = None
    rule: RuleId | None = None
    error: ErrorInfo | None = None


StageName = Literal[
    "cache",  # an exact or semantic cache hit
    "verified",  # a verified query matched: its SQL is reused
    "metric",  # a verified metric template matched
    "intent",  # what kind of question this is (a constrained choice)
    "scope",  # which views the generation sees: the full schema or retrieved ones
    "sql",  # generated (or reused) SQL, before validation
    "validation",  # the validator's verdict
    "explain",  # the EXPLAIN gate's plan
    "rows",  # the executor's result shape (the rows themselves are in the answer)
    "retry",  # the one retry, with what it was told
    "clarify",  # a multiple-choice question back to the asker
    "summary",  # the natural-language answer
    "chart",  # the Vega-Lite spec chosen from the result's shape
]


class StageEvent(Envelope):
    """One stage of answering a question, streamed to the asker as it happens."""

    kind: Literal["sql.stage"] = "sql.stage"
    request_id: RequestId
    stage: StageName
    seconds: float = Field(default=0.0, ge=0)  # how long the stage took
    data: dict[str, Any] = {}


# sqlflow's default `keepalive_interval`, and the silence an asker waits by default once
# the orchestrator has taken its question (the CLI, `text2sql.client`, the edge's
# `sql_idle_timeout`): six missed keepalives, so it measures an orchestrator gone, never a
# slow model. Before that, a question may wait in INGRESS behind others, where nothing
# speaks for it: `FIRST_TIMEOUT` (the edge: its `sql_timeout`, the question's deadline).
KEEPALIVE_INTERVAL = 5.0
IDLE_TIMEOUT = 30.0
FIRST_TIMEOUT = 120.0


class StageProgress(Envelope):
    """A question still being worked on: sqlflow sends one on the asker's reply inbox
    every `keepalive_interval` seconds until the answer, so that silence there means
    the orchestrator is gone (stopped, crashed, cut off), not that a stage is slow (a
    CPU model writing SQL at a token a second). Not a stage: it ends nothing, and the
    answer's `stages` never counts it."""

    kind: Literal["sql.progress"] = "sql.progress"
    request_id: RequestId
    # The stage under way (named by the stage event it will end with), or None between
    # stages and while the question is matched against the tenant's knowledge.
    stage: StageName | None = None
    seconds: float = Field(default=0.0, ge=0)  # how long that stage has run so far
    elapsed: float = Field(default=0.0, ge=0)  # since the orchestrator took the question
    # Output tokens the stage's model call has streamed so far (0: still in prefill, or
    # queued); None when the stage under way is no model call.
    tokens: int | None = Field(default=None, ge=0)


AnswerPath = Literal[
    "exact_cache",  # the same question, same knowledge version, recently answered
    "semantic_cache",  # a near-identical earlier question's SQL, re-run
    "verified",  # a verified query's SQL, re-run for fresh data
    "metric",  # a verified metric's SQL template
    "generated",  # SQL written by the model under the tenant's grammar
    "fixed",  # the tenant's own SQL, validated (and corrected once if needed)
    "no_sql",  # out of scope or chit-chat: answered without SQL
    "clarify",  # two failed attempts: a question back instead of more tokens
    "error",
]


class Clarification(Model):
    question: Text
    options: Annotated[list[Text], Field(max_length=8)] = []


Number = int | float


class FactPoint(Model):
    """One labelled figure: a column's value, or a series point (label = its date)."""

    label: ShortText
    value: Number | None


class FactShare(Model):
    """One group of a breakdown: its value and, when a total makes sense, its share (%)."""

    label: ShortText
    value: Number
    share: float | None = None


class ResultFacts(Model):
    """What a result says, computed from its rows without a model
    (switchyard.text2sql.facts): the summary is written from these, and only these.

    `value`: one row (`values`, one per column); `series`: a date-like label column and
    a numeric `measure` (`first`, `last`, `low`, `high`, `change`, `change_pct`);
    `breakdown`: a text label column and one numeric `measure` (`top`, `total`, `others`);
    `table`: any other shape (`row_count`, `columns`); `empty`: no rows.
    Figures cover the rows returned: `truncated` says there were more."""

    kind: Literal["value", "series", "breakdown", "table", "empty"]
    row_count: int = Field(ge=0)
    truncated: bool = False
    columns: Annotated[list[ShortText], Field(max_length=512)] = []
    measure: ShortText | None = None
    label: ShortText | None = None  # the series' date column, the breakdown's label column
    decimals: int = Field(default=0, ge=0, le=6)  # how the measure's numbers are written
    values: Annotated[list[FactPoint], Field(max_length=16)] = []
    first: FactPoint | None = None
    last: FactPoint | None = None
    low: FactPoint | None = None
    high: FactPoint | None = None
    change: Number | None = None
    change_pct: float | None = None
    top: Annotated[list[FactShare], Field(max_length=16)] = []
    total: Number | None = None
    others: int = Field(default=0, ge=0)  # groups after `top`


class SqlAnswer(Envelope):
    """The outcome of one question, on `res.sql.<tenant>` and last on the reply inbox."""

    kind: Literal["sql.answer"] = "sql.answer"
    request_id: RequestId
    status: Literal["ok", "clarify", "rejected", "error"]
    path: AnswerPath
    question: Text
    intent: ShortText | None = None
    sql: SqlText | None = None  # canonical, as validated and executed
    columns: Annotated[list[ShortText], Field(max_length=512)] = []
    rows: Annotated[list[list[Cell]], Field(max_length=100_000)] = []
    truncated: bool = False
    summary: Text | None = None
    # template: written from `facts`; model: the model's rephrasing, checked against them.
    summary_source: Literal["template", "model"] | None = None
    facts: ResultFacts | None = None
    chart: dict[str, Any] | None = None  # Vega-Lite; data, never code
    clarification: Clarification | None = None
    attempts: int = Field(default=0, ge=0, le=2)  # generation attempts (retry = 2)
    knowledge_version: ShortText | None = None
    reference: ShortText | None = None  # the verified query or metric reused
    stages: dict[str, float] = {}  # seconds per stage
    duration: float = 0.0
    error: ErrorInfo | None = None


class AuditEvent(Envelope):
    """A decision worth keeping, on `audit.<kind>.<tenant>`. Never carries result rows."""

    kind: Literal["audit"] = "audit"
    request_id: RequestId
    event: ShortText
    actor: ShortText
    verdict: ShortText | None = None
    rule: RuleId | None = None
    question: Text | None = None
    sql: Text | None = None
    sql_hash: Sha256 | None = None
    killed: bool = False
    plan: Annotated[list[dict[str, Any]], Field(max_length=64)] = []
    rows_scanned: int | None = None
    rows_returned: int | None = None
    duration: float | None = None
    detail: dict[str, Any] = {}
    subject_tenant: TenantId | None = None
