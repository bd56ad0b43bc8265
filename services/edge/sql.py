"""`POST /v1/sql/ask`: a tenant's question for Text2SQL, and its answer as JSON or SSE.

The edge adds the tenant (from the API key, never the body), the request id and a
deadline, and sends the `SqlAsk` on `sql.in.<tenant>` through the request lifecycle
(`edge.lifecycle`, as a chat: Idempotency-Key, patience through a leader election,
a typed 503 `bus_unavailable`), reading the orchestrator's `StageEvent`s and final
`SqlAnswer` from its reply inbox. A stream renders each stage as
`data: {"type": "stage", ...}`, each of the orchestrator's keepalives (every few
seconds while it works: which stage, for how long, the model's tokens so far) as
`data: {"type": "progress", ...}`, then `data: {"type": "answer", ...}`, then
`data: [DONE]`. The keepalives are also what keeps a proxy from closing a stream
that waits on a slow model; the edge's `sql_idle_timeout` is silence on the bus,
which they make an orchestrator gone, not a slow stage.

When the client goes away before the answer, the lifecycle publishes
`cancel.<request id>`: sqlflow stops the question (and its model call) and answers
it `cancelled`, on `res.sql.<tenant>` like any other answer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from services.edge import sse
from services.edge.errors import ApiError, Statuses
from services.edge.lifecycle import Flight
from switchyard.bus.reply import Progress
from switchyard.messages.inference import ErrorInfo
from switchyard.messages.sql import (
    AnswerPath,
    Cell,
    Clarification,
    ResultFacts,
    SqlAnswer,
    SqlAsk,
    SqlText,
    StageEvent,
    StageName,
    StageProgress,
)

MAX_ROWS = 10_000  # the HTTP cap; the bus allows more, an HTTP body should not carry it

# A question gone silent (its orchestrator, or the model call it waits on) is an upstream's
# timeout: 504, where a chat's queue wait is a 408.
SQL_STATUS: Statuses = {"timeout": 504}

# What a client sees of a `SqlAnswer`: the outcome, not the envelope (ids, trace, reply).
ANSWER_FIELDS = {
    "request_id", "status", "path", "sql", "columns", "rows", "truncated", "summary",
    "summary_source", "facts", "chart", "clarification", "stages", "duration", "error",
}  # fmt: skip


class SqlAskBody(BaseModel):
    """A question. There is no `tenant` field: the tenant is the API key's."""

    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = Field(
        description="the question, in natural language"
    )
    sql: SqlText | None = Field(
        default=None, description="your own SQL to validate (and correct once if needed)"
    )
    max_rows: int = Field(default=1000, ge=1, le=MAX_ROWS)
    no_cache: bool = Field(default=False, description="skip the answer and result caches")
    stream: bool = Field(default=False, description="stage events as SSE, then the answer")

    def ask(
        self, tenant: str, request_id: str, deadline: float, trace: str | None = None
    ) -> SqlAsk:
        return SqlAsk(
            id=request_id, tenant=tenant, question=self.question, fix_sql=self.sql,
            max_rows=self.max_rows, no_cache=self.no_cache, deadline=deadline, trace=trace,
        )  # fmt: skip


class SqlAnswerBody(BaseModel):
    """The answer (`status` ok or clarify; errors are HTTP errors, or an SSE event)."""

    request_id: str
    status: Literal["ok", "clarify", "rejected", "error"]
    path: AnswerPath
    sql: str | None = None
    columns: list[str] = []
    rows: list[list[Cell]] = []
    truncated: bool = False
    summary: str | None = None
    summary_source: Literal["template", "model"] | None = Field(
        default=None, description="template: written from `facts`; model: a checked rephrasing"
    )
    facts: ResultFacts | None = Field(
        default=None, description="the result's facts, computed from its rows without a model"
    )
    chart: dict[str, Any] | None = Field(default=None, description="Vega-Lite spec")
    clarification: Clarification | None = None
    stages: dict[str, float] = Field(default={}, description="seconds per stage")
    duration: float = 0.0
    error: ErrorInfo | None = None


class StageBody(BaseModel):
    """One SSE stage event (documentation of the stream's shape)."""

    type: Literal["stage"] = "stage"
    stage: StageName
    seconds: float
    data: dict[str, Any] = {}


class ProgressBody(BaseModel):
    """One SSE keepalive: the question is still worked on (not a stage; a client that
    lists stages skips it)."""

    type: Literal["progress"] = "progress"
    stage: StageName | None = Field(description="the stage under way; null between stages")
    seconds: float = Field(description="how long that stage has run so far")
    elapsed: float = Field(description="since the orchestrator took the question")
    tokens: int | None = Field(
        description="output tokens the stage's model call has streamed so far; null: no model call"
    )


def answer_body(answer: SqlAnswer) -> dict[str, Any]:
    return answer.model_dump(mode="json", include=ANSWER_FIELDS)


def stage_body(event: StageEvent) -> dict[str, Any]:
    return StageBody(stage=event.stage, seconds=event.seconds, data=event.data).model_dump(
        mode="json"
    )


def progress_body(progress: StageProgress) -> dict[str, Any]:
    body = ProgressBody(stage=progress.stage, seconds=progress.seconds,
                        elapsed=progress.elapsed, tokens=progress.tokens)  # fmt: skip
    return body.model_dump(mode="json")


class SqlStream(sse.Render[SqlAnswer]):
    """A streamed question: an event per stage and per keepalive, then the answer whatever
    its status (an error event only when no answer came)."""

    def progress(self, item: Progress) -> str | None:
        if isinstance(item, StageEvent):
            return sse.event(stage_body(item))
        if isinstance(item, StageProgress):
            return sse.event(progress_body(item))
        return None

    async def final(self, flight: Flight[SqlAnswer], final: SqlAnswer) -> list[str]:
        await flight.finish(final)  # (one that is not an answer releases the key)
        return [sse.event({"type": "answer", **answer_body(final)})]

    def error(self, error: ApiError, request_id: str) -> str:
        return sse.event({"type": "error", **error.body(request_id)})


def replayed_stream(answer: SqlAnswer) -> str:
    """A retried question's stream: its original's answer, then `[DONE]`."""
    return sse.event({"type": "answer", **answer_body(answer)}) + sse.DONE
