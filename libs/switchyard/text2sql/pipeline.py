"""Answering one question: cheapest correct path first, every stage streamed and timed.

1. exact cache (tenant, normalised question, knowledge version);
2. a verified query (in any language) close in meaning that names the same time
   window, numbers, metrics and terms (matching): its SQL, re-executed for fresh data;
3. the semantic cache (optional, strict, tenant-partitioned): an earlier answer's SQL;
4. a verified metric the question names, in the metric's shape (metric_match):
   the metric's SQL template with the window the question names;
5. intent (a constrained choice): out-of-scope and chit-chat end here, without SQL;
6. scope: the whole schema when it fits the budget, else the retrieved views;
7. generation under a SELECT grammar of the tenant's policy, over the views the
   question needs (joins of up to three along declared keys) -> validator -> EXPLAIN gate ->
   executor; on a refusal exactly one retry that carries what is new (the rule,
   the plan, the real columns, the values that exist); a second refusal asks the
   asker a multiple-choice question instead of spending more tokens;
8. the result's facts (deterministic), the summary written from them (a template
   sentence; a model's rephrasing only when configured, and only if it states nothing
   the facts do not), and a chart spec. Rows stay away from the model unless allowed.

The orchestrator never holds database credentials or the signing key: SQL from
any path, verified or generated, goes through the same validator and executor.
Deterministic paths (verified, metric) run before the intent call: a verified
match needs no model to be right, and a small model's intent guess must not be
able to turn a known metric away.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from switchyard.bus.connection import Bus
from switchyard.errors import ErrorCode, SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.inference import ChoiceConstraint, ErrorInfo, GrammarConstraint
from switchyard.messages.sql import (
    AnswerPath,
    Clarification,
    ExecuteReply,
    ResultFacts,
    SqlAnswer,
    SqlAsk,
    StageName,
    StageProgress,
    ValidateReply,
)
from switchyard.sqlguard.audit import publish_audit, sql_audit
from switchyard.sqlguard.policy import Policy, PolicyStore
from switchyard.text2sql import metric_match, prompts
from switchyard.text2sql.caches import TtlCache
from switchyard.text2sql.chart import chart_for
from switchyard.text2sql.facts import facts_text, result_facts, template_summary, ungrounded
from switchyard.text2sql.fleet import Completion, FleetModel
from switchyard.text2sql.grammar import (
    GRAMMAR_MAX_BYTES,
    GRAMMAR_VIEWS,
    MAX_GRAMMAR_VIEWS,
    anchor_views,
    choose_views,
    select_grammar,
)
from switchyard.text2sql.guard import GuardClient
from switchyard.text2sql.index import Hit, KnowledgeIndex
from switchyard.text2sql.knowledge import KnowledgeStore, TenantKnowledge
from switchyard.text2sql.matching import (
    CANDIDATES,
    SEMANTIC_THRESHOLD,
    VERIFIED_THRESHOLD,
    reusable,
)
from switchyard.text2sql.normalise import normalise_question
from switchyard.text2sql.vocabulary import vocabulary_for
from switchyard.token_estimate import CHARS_PER_TOKEN, estimate_text_tokens

log = get_logger(__name__)

Emit = Callable[[StageName, float, dict[str, Any]], Awaitable[None]]
# A small model may echo the prompt's labels before its sentence.
_LABEL = re.compile(r"^(?:(?:draft|answer|summary|sentence|result)\s*:\s*)+", re.IGNORECASE)
NOT_GENERATED = "no verified query or metric answers this, and SQL generation is off"
# The retry's new information (columns, values) is capped to this many tokens.
RETRY_INFO_TOKENS = 250


class FlowOptions(BaseModel):
    """The pipeline's knobs; sqlflow's settings read them from `SY_*` (one declaration)."""

    # Cosines a stored question needs, besides the same specifics (text2sql.matching).
    verified_threshold: float = Field(default=VERIFIED_THRESHOLD, gt=0, le=1)
    semantic_cache: bool = False
    semantic_threshold: float = Field(default=SEMANTIC_THRESHOLD, gt=0, le=1)
    # Off (SY_GENERATION=false): only verified queries and metrics answer; any other
    # question gets the nearest of them offered back (a clarification), and no model
    # writes SQL.
    generation: bool = True
    # "auto": the whole schema when it fits `context_budget_tokens`, retrieval otherwise.
    scope: Literal["auto", "full", "retrieval"] = "auto"
    # The generation prompt's budget (schema, conventions, examples), estimated tokens:
    # sized for the CPU model's 2,048-token context; raise it on a GPU model.
    context_budget_tokens: int = Field(default=1200, ge=64)
    retrieval_views: int = Field(default=4, ge=1, le=64)
    # The most views the generation grammar covers: those the question needs
    # (grammar.choose_views); its size grows with their joins.
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
    sample_values: int = 5


@dataclass
class Attempt:
    """One statement's way through the walls."""

    sql: str
    verdict: ValidateReply | None = None
    rows: ExecuteReply | None = None
    failure: prompts.Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.rows is not None


@dataclass
class Underway:
    """What a question is doing now, for its keepalive frames (`StageProgress`, sent by
    whoever runs the pipeline): the stage under way, since when, and the output tokens its
    model call has streamed so far (None: no model call)."""

    started: float = field(default_factory=time.perf_counter)
    stage: StageName | None = None
    since: float = field(default_factory=time.perf_counter)
    tokens: int | None = None

    def begin(self, stage: StageName, *, model: bool = False) -> None:
        self.stage, self.since, self.tokens = stage, time.perf_counter(), 0 if model else None

    def done(self) -> None:
        self.stage, self.since, self.tokens = None, time.perf_counter(), None

    def streamed(self, tokens: int) -> None:
        self.tokens = (self.tokens or 0) + tokens

    def progress(self, ask: SqlAsk) -> StageProgress:
        now = time.perf_counter()
        return StageProgress(
            tenant=ask.tenant, trace=ask.trace, request_id=ask.id, stage=self.stage,
            seconds=now - self.since, elapsed=now - self.started, tokens=self.tokens,
        )  # fmt: skip


@dataclass
class Run:
    """The state of one question while it is answered."""

    ask: SqlAsk
    emit: Emit
    knowledge: TenantKnowledge
    policy: Policy
    started: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)
    intent: str | None = None
    underway: Underway = field(default_factory=Underway)

    async def stage(self, stage: StageName, seconds: float, **data: Any) -> None:
        self.stages[stage] = round(self.stages.get(stage, 0.0) + seconds, 6)
        self.underway.done()
        await self.emit(stage, seconds, data)

    def answer(self, **fields: Any) -> SqlAnswer:
        fields.setdefault("knowledge_version", self.knowledge.version)
        return SqlAnswer(
            tenant=self.ask.tenant,
            trace=self.ask.trace,
            request_id=self.ask.id,
            question=self.ask.question,
            intent=self.intent,
            stages=self.stages,
            duration=time.perf_counter() - self.started,
            **fields,
        )


class Pipeline:
    def __init__(
        self,
        bus: Bus,
        store: KnowledgeStore,
        policies: PolicyStore,
        index: KnowledgeIndex,
        model: FleetModel,
        guard: GuardClient,
        options: FlowOptions | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.policies = policies
        self.index = index
        self.model = model
        self.guard = guard
        self.options = options or FlowOptions()
        self.exact: TtlCache[SqlAnswer] = TtlCache(ttl=self.options.exact_cache_ttl)
        self.results: TtlCache[ExecuteReply] = TtlCache(ttl=self.options.result_cache_ttl)

    # -- entry -------------------------------------------------------------------------

    async def answer(self, ask: SqlAsk, emit: Emit, underway: Underway | None = None) -> SqlAnswer:
        """Answer `ask`; every outcome, refusals included, is an answer and is audited.
        `underway` is kept up to date with the stage being worked on."""
        try:
            run = await self._start(ask, emit, underway or Underway())
        except SwitchyardError as exc:
            answer = error_answer(ask, exc.code, exc.reason[:4096])
        else:
            try:
                answer = await self._answer(run)
            except SwitchyardError as exc:
                answer = run.answer(status="error", path="error", error=_info(exc))
        await self.audit(answer)
        return answer

    async def _start(self, ask: SqlAsk, emit: Emit, underway: Underway) -> Run:
        policy = self.policies.get(ask.tenant)
        if policy is None or not policy.database:
            raise SwitchyardError(f"no SQL policy for tenant {ask.tenant!r}", code="unknown_tenant")
        try:
            knowledge = self.store.load(ask.tenant).restricted_to(policy)
        except SwitchyardError as exc:
            raise SwitchyardError(exc.reason, code="unknown_tenant") from exc
        await asyncio.to_thread(self.index.sync, knowledge)
        return Run(ask, emit, knowledge, policy, underway=underway)

    async def _answer(self, run: Run) -> SqlAnswer:
        ask, o = run.ask, self.options
        if ask.fix_sql is not None:
            return await self._fix(run, ask.fix_sql)
        key = (ask.tenant, normalise_question(ask.question), run.knowledge.version)
        if not ask.no_cache and (cached := self.exact.get(key)) is not None:
            await run.stage("cache", 0.0, cache="exact", request_id=cached.request_id)
            return run.answer(**_reuse(cached), path="exact_cache")
        answer = await self._deterministic(run)
        if answer is None and not o.generation:
            answer = await self._clarify(run, None, NOT_GENERATED)
        elif answer is None:
            answer = await self._generated(run)
        if answer.status == "ok" and not ask.no_cache:
            self.exact.put(key, answer)
            if o.semantic_cache and answer.path == "generated" and answer.sql:
                await asyncio.to_thread(
                    self.index.add, ask.tenant, "answer", ask.id, ask.question,
                    {"sql": answer.sql, "knowledge_version": run.knowledge.version},
                )  # fmt: skip
        return answer

    # -- paths without a model ---------------------------------------------------------

    async def _search(self, run: Run, kinds: list[Any], limit: int = 1) -> list[Hit]:
        return await asyncio.to_thread(
            self.index.search, run.ask.tenant, run.ask.question, kinds=kinds, limit=limit
        )

    async def _deterministic(self, run: Run) -> SqlAnswer | None:
        o, question = self.options, normalise_question(run.ask.question)
        question_asked, words = run.ask.question, vocabulary_for(run.knowledge)
        t = time.perf_counter()
        exact = next(
            (q for q in run.knowledge.verified if normalise_question(q.question) == question), None
        )
        hits = [] if exact else await self._search(run, ["verified"], limit=CANDIDATES)
        hit = next((h for h in hits
                    if reusable(question_asked, h.text, h.score, o.verified_threshold, words)),
                   None)  # fmt: skip
        query, score = exact, 1.0
        if hit is not None:
            ref = str(hit.payload.get("id", hit.ref))
            query = next((q for q in run.knowledge.verified if q.id == ref), None)
            score = hit.score
        if query is not None:
            await run.stage("verified", time.perf_counter() - t, id=query.id,
                            question=query.question, score=round(score, 4))  # fmt: skip
            answer = await self._reuse_sql(run, query.sql, "verified", query.id)
            if answer is not None:
                return answer
        if o.semantic_cache and not run.ask.no_cache:
            t = time.perf_counter()
            sem = await self._search(run, ["answer"])
            if (
                sem
                and sem[0].payload.get("knowledge_version") == run.knowledge.version
                and reusable(question_asked, sem[0].text, sem[0].score, o.semantic_threshold, words)
            ):
                await run.stage("cache", time.perf_counter() - t, cache="semantic",
                                question=sem[0].text, score=round(sem[0].score, 4))  # fmt: skip
                answer = await self._reuse_sql(
                    run, str(sem[0].payload["sql"]), "semantic_cache", sem[0].ref
                )
                if answer is not None:
                    return answer
        t = time.perf_counter()
        # The vocabulary decides: a metric answers only a question that names it and no
        # other metric (metric_match.answers), so a similarity search could add nothing.
        named = words.metrics_named(question_asked)
        metric = run.knowledge.metric(next(iter(named))) if len(named) == 1 else None
        if metric is not None and metric_match.answers(question_asked, metric, words):
            params = metric_match.parameters(run.ask.question, metric)
            run.intent = "metric"
            await run.stage("metric", time.perf_counter() - t, name=metric.name, params=params)
            answer = await self._reuse_sql(run, metric.render(**params), "metric", metric.name)
            if answer is not None:
                return answer
        return None

    async def _reuse_sql(
        self, run: Run, sql: str, path: AnswerPath, reference: str
    ) -> SqlAnswer | None:
        """Run known SQL through the walls; None (fall through) when they refuse it now."""
        await run.stage("sql", 0.0, sql=sql, source=path)
        attempt = await self._through_walls(run, sql)
        if not attempt.ok:
            log.warning("sqlflow.reuse_refused", path=path, reference=reference,
                        reason=attempt.failure.describe() if attempt.failure else "-")  # fmt: skip
            return None
        return await self._finish(run, attempt, path, attempts=0, reference=reference)

    # -- generation --------------------------------------------------------------------

    async def _generated(self, run: Run) -> SqlAnswer:
        ask = run.ask
        t = time.perf_counter()
        run.underway.begin("intent", model=True)
        choice = await self.model.complete(
            ask.tenant, prompts.intent_messages(ask.question),
            constraint=ChoiceConstraint(choices=list(prompts.INTENTS)), max_tokens=8,
            deadline=ask.deadline, trace=ask.trace, streamed=run.underway.streamed,
        )  # fmt: skip
        said = choice.text.strip()
        run.intent = said if said in prompts.INTENTS else "lookup"
        # A small model's guess may not turn a question about the tenant's own views,
        # columns or metrics away: those are answered with SQL whatever it says.
        overruled = run.intent in prompts.NO_SQL_INTENTS and _mentions_schema(
            ask.question, run.knowledge
        )
        if overruled:
            run.intent = "lookup"
        await run.stage("intent", time.perf_counter() - t, intent=run.intent, model_said=said,
                        overruled=overruled)  # fmt: skip
        if run.intent in prompts.NO_SQL_INTENTS:
            text = ("That is not something the game data can answer. Ask about players, "
                    "activity, retention, revenue, payers, servers or events.")  # fmt: skip
            return run.answer(status="ok", path="no_sql", summary=text, summary_source="template")
        views, schema, conventions, examples = await self._scope(run)
        first = prompts.sql_messages(ask.question, schema, conventions, examples)
        return await self._attempts(run, first, views, path="generated")

    async def _scope(self, run: Run) -> tuple[list[str], str, str, list[prompts.Example]]:
        """What the generation sees, within `context_budget_tokens` (estimated), and the
        views its grammar covers: those the question needs (grammar.choose_views, most
        needed first). The prompt shows the whole schema when it fits in 60 % of the
        budget, else those views, as many as fit; then the most relevant conventions
        and verified examples in what is left."""
        o, k = self.options, run.knowledge
        t = time.perf_counter()
        run.underway.begin("scope")
        budget = o.context_budget_tokens
        every = [v.name for v in k.views]
        full = k.schema_text()
        mode = o.scope
        if mode == "auto":
            mode = "full" if estimate_text_tokens(full) <= budget * 0.6 else "retrieval"
        # The views are the ones the question needs, most needed first (the grammar
        # covers them); in retrieval mode the prompt shows the same views.
        hits = await self._search(run, ["view"], limit=len(every))
        scores = {h.ref: h.score for h in hits if h.ref in every}
        ranked = [*scores, *(v for v in every if v not in scores)]
        columns = {v.name: [c.name for c in v.columns] for v in k.views}
        views = choose_views(run.ask.question, ranked, columns, scores=scores,
                             limit=o.grammar_views)  # fmt: skip
        schema = full
        if mode == "retrieval":
            fitted = views[:1]
            for name in views[1 : o.retrieval_views]:
                if estimate_text_tokens(k.schema_text([*fitted, name])) > budget * 0.6:
                    break
                fitted.append(name)
            views, schema = fitted, k.schema_text(fitted)
        left = max(0, budget - estimate_text_tokens(schema))
        sections = await self._search(run, ["semantics"], limit=2)
        conventions = _fit("\n".join(h.text for h in sections), left // 2)
        left -= estimate_text_tokens(conventions)
        examples: list[prompts.Example] = []
        for h in await self._search(run, ["verified"], limit=o.few_shots):
            example = prompts.Example(h.text, str(h.payload["sql"]))
            cost = estimate_text_tokens(example.question + example.sql) + 8
            if cost > left:
                break
            examples.append(example)
            left -= cost
        await run.stage("scope", time.perf_counter() - t, mode=mode, views=views,
                        examples=[e.question for e in examples])  # fmt: skip
        return views, schema, conventions, examples

    async def _attempts(
        self, run: Run, first: list[Any], views: list[str], *, path: AnswerPath,
        given: str | None = None,
    ) -> SqlAnswer:  # fmt: skip
        ask = run.ask
        grammar = GrammarConstraint(gbnf=self._grammar(run, views))
        messages = first
        sql = given
        for attempt_no in (1, 2):
            done: Completion | None = None
            if sql is None:
                t = time.perf_counter()
                run.underway.begin("sql", model=True)
                done = await self.model.complete(
                    ask.tenant, messages, constraint=grammar,
                    max_tokens=self.options.sql_max_tokens, deadline=ask.deadline,
                    trace=ask.trace, streamed=run.underway.streamed,
                )  # fmt: skip
                sql = done.text.strip()
                await run.stage("sql", time.perf_counter() - t, sql=sql, attempt=attempt_no,
                                finish=done.result.finish_reason)  # fmt: skip
            if done is not None and done.result.finish_reason == "length":
                # The grammar guarantees a valid statement only when it is finished: a
                # cut one is refused here, with the reason, not sent to be parsed.
                reason = (f"the statement was cut off at {self.options.sql_max_tokens} "
                          "tokens; write a shorter one")  # fmt: skip
                attempt = Attempt(sql, failure=prompts.Failure("generation", None, reason, []))
            else:
                attempt = await self._through_walls(run, sql)
            if attempt.ok:
                return await self._finish(run, attempt, path, attempts=attempt_no)
            if attempt.failure is None:
                raise SwitchyardError("an attempt that is not ok carries no failure")
            if attempt_no == 2:
                break
            # What is new for the retry, capped so the retry still fits the context.
            involved = _views_in(sql, run.knowledge) or views
            columns = _fit(run.knowledge.schema_text(involved), RETRY_INFO_TOKENS)
            known = _sample_values(run.knowledge, involved, sql, self.options.sample_values)
            values = _fit(known, RETRY_INFO_TOKENS // 2)
            messages = prompts.retry_messages(messages, sql, attempt.failure, columns, values)
            await run.stage("retry", 0.0, failure=attempt.failure.describe(),
                            rule=attempt.failure.rule, columns=columns, values=values)  # fmt: skip
            sql = None
        return await self._clarify(run, attempt.failure)

    def _grammar(self, run: Run, views: list[str]) -> str:
        """The SELECT grammar over the first `grammar_views` views of the scope (most
        needed first), joining up to three along the declared keys, plus the subqueries
        the tenant's conventions take "the latest day" from.

        Its size grows with the views' join paths (the worst 5 demo views: ~37 KB), so
        one over GRAMMAR_MAX_BYTES drops its least needed views until it fits."""
        k = run.knowledge
        chosen = views[: self.options.grammar_views]
        anchors = [a for a in anchor_views(k.semantics) if k.view(a) is not None]
        while True:
            gbnf = select_grammar(run.policy, chosen, subquery_views=anchors)
            if len(gbnf.encode()) <= GRAMMAR_MAX_BYTES or len(chosen) <= 1:
                return gbnf
            chosen = chosen[:-1]

    async def _fix(self, run: Run, sql: str) -> SqlAnswer:
        """The tenant's own SQL as attempt 1; one corrected attempt if the walls refuse it."""
        ranked, schema, _, _ = await self._scope(run)
        mentioned = _views_in(sql, run.knowledge)
        views = mentioned + [v for v in ranked if v not in mentioned]
        if mentioned:
            schema = _fit(run.knowledge.schema_text(views[: self.options.grammar_views]),
                          int(self.options.context_budget_tokens * 0.6))  # fmt: skip
        keep = "Keep the statement's meaning; only make it valid for these views."
        first = prompts.sql_messages(run.ask.question, schema, keep, [])
        await run.stage("sql", 0.0, sql=sql, source="tenant")
        return await self._attempts(run, first, views, path="fixed", given=sql)

    async def _clarify(
        self, run: Run, failure: prompts.Failure | None, reason: str = "refused"
    ) -> SqlAnswer:
        t = time.perf_counter()
        hits = await self._search(run, ["verified", "metric"], limit=3)
        options = [h.text if h.kind == "verified" else h.text.split("\n", 1)[0] for h in hits]
        options.append("None of these: I will rephrase the question.")
        clarification = Clarification(
            question="I could not write a query I can vouch for. Did you mean one of these?",
            options=options,
        )
        said = failure.describe() if failure else reason
        await run.stage("clarify", time.perf_counter() - t, question=clarification.question,
                        options=options, failure=said)  # fmt: skip
        error = ErrorInfo(code="rejected_sql", reason=said)
        return run.answer(status="clarify", path="clarify", clarification=clarification,
                          attempts=2 if failure else 0, error=error)  # fmt: skip

    # -- the walls ---------------------------------------------------------------------

    async def _through_walls(self, run: Run, sql: str) -> Attempt:
        ask, database = run.ask, run.policy.database
        if database is None:
            raise SwitchyardError(f"tenant {ask.tenant}'s policy names no database")
        attempt = Attempt(sql)
        t = time.perf_counter()
        run.underway.begin("validation")
        verdict = await self.guard.validate(
            ask.tenant, sql, database, question=ask.question, trace=ask.trace
        )
        attempt.verdict = verdict
        await run.stage("validation", time.perf_counter() - t, ok=verdict.ok, rule=verdict.rule,
                        canonical_sql=verdict.canonical_sql, tables=verdict.tables)  # fmt: skip
        if not verdict.ok:
            reason = verdict.error.reason if verdict.error else "refused"
            attempt.failure = prompts.Failure("validation", verdict.rule, reason, [])
            return attempt
        if verdict.canonical_sql is None:
            raise SwitchyardError("the validator approved a statement without its canonical SQL")
        key = (ask.tenant, verdict.canonical_sql)
        if not ask.no_cache and (cached := self.results.get(key)) is not None:
            await run.stage("cache", 0.0, cache="result")
            attempt.rows = cached
            return attempt
        # One call: the executor's EXPLAIN gate, then the run; a refusal without
        # `gate_passed` (the plan, or a check before it) is the "explain" stage's.
        t = time.perf_counter()
        run.underway.begin("explain")  # (and then "rows": the same call)
        rows = await self.guard.run(ask.tenant, verdict, database, max_rows=ask.max_rows,
                                    gate=True, trace=ask.trace)  # fmt: skip
        took = time.perf_counter() - t  # split: the statement's own time is the run's
        ran = min(took, rows.db_duration or 0.0) if rows.gate_passed else 0.0
        await run.stage("explain", took - ran, ok=rows.gate_passed,
                        rule=None if rows.gate_passed else rows.rule,
                        rows_estimated=rows.rows_estimated, plan=rows.plan[:8])  # fmt: skip
        if not rows.gate_passed:
            reason = rows.error.reason if rows.error else "refused"
            attempt.failure = prompts.Failure("explain", rows.rule, reason, rows.plan)
            return attempt
        await run.stage("rows", ran, ok=rows.ok, rule=rows.rule,
                        columns=rows.columns, count=len(rows.rows), truncated=rows.truncated,
                        db_seconds=rows.db_duration)  # fmt: skip
        if not rows.ok:
            reason = rows.error.reason if rows.error else "failed"
            attempt.failure = prompts.Failure("execution", rows.rule, reason, rows.plan)
            return attempt
        self.results.put(key, rows)
        attempt.rows = rows
        return attempt

    async def _finish(
        self, run: Run, attempt: Attempt, path: AnswerPath, *, attempts: int,
        reference: str | None = None,
    ) -> SqlAnswer:  # fmt: skip
        rows, verdict = attempt.rows, attempt.verdict
        if rows is None or verdict is None:
            raise SwitchyardError("only an attempt that passed the walls is finished")
        facts = result_facts(rows.columns, rows.rows, rows.truncated)
        summary, source = None, None
        if self.options.summary:
            summary, source = await self._summary(run, facts, rows)
        t = time.perf_counter()
        chart = chart_for(rows.columns, rows.rows)
        await run.stage("chart", time.perf_counter() - t, mark=chart.get("mark") if chart else None)
        return run.answer(
            status="ok", path=path, sql=verdict.canonical_sql, columns=rows.columns,
            rows=rows.rows, truncated=rows.truncated, summary=summary, summary_source=source,
            facts=facts, chart=chart, attempts=attempts, reference=reference,
        )  # fmt: skip

    async def _summary(
        self, run: Run, facts: ResultFacts, rows: ExecuteReply
    ) -> tuple[str, Literal["template", "model"]]:
        """The template sentence; with `summary_source="model"`, the model's rephrasing of
        it instead, unless that states a number, date or name the facts do not (then the
        template, and the stage says `replaced`), was cut by the token limit, or the call
        failed."""
        t = time.perf_counter()
        question = run.ask.question
        template = template_summary(facts, question)
        if self.options.summary_source == "template":
            await run.stage("summary", time.perf_counter() - t, text=template, source="template",
                            facts=facts.model_dump(mode="json", exclude_defaults=True))  # fmt: skip
            return template, "template"
        digest = (prompts.result_digest(rows.columns, rows.rows, include_rows=True)
                  if self.options.rows_to_model else None)  # fmt: skip
        said: str | None = None
        run.underway.begin("summary", model=True)
        try:
            done = await self.model.complete(
                run.ask.tenant, prompts.summary_messages(question, template, facts_text(facts),
                                                         digest),
                max_tokens=self.options.summary_max_tokens, deadline=run.ask.deadline,
                trace=run.ask.trace, streamed=run.underway.streamed,
            )  # fmt: skip
            # A sentence cut by the token limit is no sentence; an echoed label is no answer.
            cut = done.result.finish_reason == "length"
            said = None if cut else _LABEL.sub("", done.text.strip()).strip() or None
        except SwitchyardError as exc:  # the rows are the answer; a summary is a courtesy
            log.warning("sqlflow.summary_failed", error=str(exc))
        stray = ungrounded(said, facts, question) if said else []
        source: Literal["template", "model"] = "model" if said and not stray else "template"
        text = said if said and source == "model" else template
        if stray:
            log.info("sqlflow.summary_replaced", ungrounded=stray[:8], said=said)
        await run.stage("summary", time.perf_counter() - t, text=text, source=source,
                        model_said=said, replaced=bool(stray), ungrounded=stray[:8],
                        facts=facts.model_dump(mode="json", exclude_defaults=True))  # fmt: skip
        return text, source

    async def audit(self, answer: SqlAnswer) -> None:
        """One audit event per question, whatever the path: what was asked, what ran."""
        event = sql_audit(
            tenant=answer.tenant, request_id=answer.request_id, event="sql.answer",
            actor="sqlflow", verdict=answer.status, sql=answer.sql, question=answer.question,
            rows_returned=len(answer.rows) if answer.status == "ok" else None,
            duration=answer.duration, trace=answer.trace, path=answer.path,
            intent=answer.intent, attempts=answer.attempts, reference=answer.reference,
            error=answer.error.reason if answer.error else None,
        )  # fmt: skip
        await publish_audit(self.bus.js, event)


def _info(exc: SwitchyardError) -> ErrorInfo:
    return ErrorInfo(code=exc.code, reason=exc.reason[:4096])


def error_answer(ask: SqlAsk, code: ErrorCode, reason: str) -> SqlAnswer:
    """The answer of a question that failed outside a `Run` (no stages): `code`, `reason`."""
    return SqlAnswer(
        tenant=ask.tenant, trace=ask.trace, request_id=ask.id, question=ask.question,
        status="error", path="error", error=ErrorInfo(code=code, reason=reason),
    )  # fmt: skip


def _reuse(cached: SqlAnswer) -> dict[str, Any]:
    keep = ("status", "sql", "columns", "rows", "truncated", "summary", "summary_source",
            "facts", "chart", "reference")  # fmt: skip
    return {k: getattr(cached, k) for k in keep}


def _mentions_schema(question: str, knowledge: TenantKnowledge) -> bool:
    """Whether the question names one of the tenant's views, columns, metrics or terms."""
    words = set(re.findall(r"[a-z0-9]+", question.lower()))
    for view in knowledge.views:
        names = [view.name, *(c.name for c in view.columns)]
        for name in names:
            parts = name.lower().split("_")
            if all(p in words or p + "s" in words or p.rstrip("s") in words for p in parts):
                return True
    # ... or any of its terms (渠道, orders, 退款): Chinese has no column names to spot.
    return bool(vocabulary_for(knowledge).read(question).concepts)


def _fit(text: str, tokens: int) -> str:
    """`text` cut to about `tokens` (estimated), at a line boundary when there is one."""
    limit = tokens * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind("\n")] if "\n" in cut else cut


def _views_in(sql: str, knowledge: TenantKnowledge) -> list[str]:
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql.lower()))
    return [v.name for v in knowledge.views if v.name.lower() in words]


def _sample_values(knowledge: TenantKnowledge, views: list[str], sql: str, k: int) -> str:
    """Known values of the columns the SQL mentions (from the schema documents)."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql.lower()))
    lines = []
    for name in views:
        view = knowledge.view(name)
        for col in view.columns if view else []:
            if col.samples and col.name.lower() in words:
                lines.append(f"{name}.{col.name}: {', '.join(col.samples[:k])}")
    return "\n".join(lines)
