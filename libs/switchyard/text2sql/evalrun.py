"""`sy sql eval`: the pipeline, in this process, against an evaluation set.

The pipeline runs here (not in a running sqlflow) so that the leakage guard can
hold: the tenant's knowledge is copied without any verified query that is one of
the evaluation's questions, and indexed into a fresh index, so no answer comes
from having seen the question before. Model calls still go through the fleet,
and every statement, gold or predicted, goes through the validator and executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from switchyard.bus.connection import Bus
from switchyard.errors import SwitchyardError
from switchyard.messages.sql import SqlAsk, StageName
from switchyard.sqlguard.policy import PolicyStore
from switchyard.text2sql.embedding import shared_embedder
from switchyard.text2sql.evaluation import (
    EvalItem,
    EvalReport,
    Prediction,
    ResultSet,
    leakage_guard,
    run_evaluation,
    same_result,
)
from switchyard.text2sql.fleet import FleetModel
from switchyard.text2sql.guard import GuardClient
from switchyard.text2sql.index import KnowledgeIndex
from switchyard.text2sql.knowledge import KnowledgeStore
from switchyard.text2sql.matching import CANDIDATES, reusable
from switchyard.text2sql.pipeline import FlowOptions, Pipeline
from switchyard.text2sql.vocabulary import vocabulary_for


def guarded_copy(
    knowledge_dir: Path, tenant: str, items: Sequence[EvalItem], into: Path
) -> list[str]:
    """Copy the knowledge tree into `into`, minus the verified queries that leak."""
    shutil.copytree(knowledge_dir, into, dirs_exist_ok=True)
    store = KnowledgeStore(into)
    _, removed = leakage_guard(store.load(tenant), items)
    for query_id in removed:
        store.remove_verified(tenant, query_id)
    return list(removed)


async def evaluate(
    bus: Bus,
    tenant: str,
    items: Sequence[EvalItem],
    *,
    knowledge_dir: Path,
    policy_dir: Path,
    options: FlowOptions,
    pool: str = "sql",
    concurrency: int = 1,
) -> tuple[EvalReport, list[str]]:
    """Answer every item; returns the report and the verified ids the guard removed."""
    policies = PolicyStore(policy_dir)
    database = _database(policies, tenant)
    guard = GuardClient(bus)
    with tempfile.TemporaryDirectory(prefix="sy-eval-") as tmp:
        removed = guarded_copy(knowledge_dir, tenant, items, Path(tmp) / "knowledge")
        index = KnowledgeIndex(shared_embedder(), path=Path(tmp) / "index")
        with contextlib.closing(index):
            pipeline = Pipeline(bus, KnowledgeStore(Path(tmp) / "knowledge"), policies, index,
                                FleetModel(bus, pool=pool), guard, options)  # fmt: skip

            async def quiet(stage: StageName, seconds: float, data: dict[str, object]) -> None:
                return None

            async def answer(item: EvalItem) -> Prediction:
                started = time.perf_counter()
                # Caches stay off unless the semantic cache is being measured: then an
                # earlier item's SQL may answer a later paraphrase, right or wrong.
                ask = SqlAsk(tenant=tenant, question=item.question,
                             no_cache=not options.semantic_cache)  # fmt: skip
                got = await pipeline.answer(ask, quiet)
                result = ResultSet(got.columns, got.rows) if got.status == "ok" else None
                return Prediction(
                    sql=got.sql, result=result, path=got.path,
                    error=got.error.reason if got.error else None,
                    seconds=time.perf_counter() - started, summary=got.summary, facts=got.facts,
                )  # fmt: skip

            gold = _gold_runner(guard, tenant, database)

            report = await run_evaluation(items, answer, gold, concurrency=concurrency)
    return report, removed


@dataclass
class CacheProbe:
    """How a semantic cache with this policy would have done on the evaluation set."""

    threshold: float
    asked: int = 0
    hits: int = 0
    false_hits: int = 0
    examples: list[tuple[str, str, float, bool]] = field(default_factory=list)

    @property
    def false_hit_rate(self) -> float:
        return self.false_hits / self.hits if self.hits else 0.0


async def probe_semantic_cache(
    bus: Bus, tenant: str, items: Sequence[EvalItem], *, knowledge_dir: Path, policy_dir: Path,
    threshold: float,
) -> CacheProbe:  # fmt: skip
    """The semantic cache's false-hit rate, independent of the model that fills it.

    Items are asked in order against a fresh cache that holds the gold SQL of every
    earlier item (as if each had been answered right). A hit is judged by running the
    cached SQL and comparing with the asked item's gold results: a false hit is a
    reused answer that is wrong for the question asked.
    """
    results = _Results(_gold_runner(GuardClient(bus), tenant,
                                    _database(PolicyStore(policy_dir), tenant)))  # fmt: skip
    vocabulary = vocabulary_for(KnowledgeStore(knowledge_dir).load(tenant))
    probe = CacheProbe(threshold)
    with contextlib.closing(KnowledgeIndex(shared_embedder(), location=":memory:")) as index:
        for item in items:
            probe.asked += 1
            found = await asyncio.to_thread(
                index.search, tenant, item.question, kinds=["answer"], limit=1
            )
            if found and reusable(
                item.question, found[0].text, found[0].score, threshold, vocabulary
            ):
                right = await results.answers(str(found[0].payload["sql"]), item)
                probe.hits += 1
                probe.false_hits += not right
                probe.examples.append((item.question, found[0].text, found[0].score, right))
            await asyncio.to_thread(
                index.add, tenant, "answer", item.id, item.question, {"sql": item.gold[0]}
            )
    return probe


@dataclass
class VerifiedProbe(CacheProbe):
    """How the verified-query match does on an evaluation set, without a model.

    An item is `reachable` when one of the tenant's verified queries returns its
    gold rows (a rewording, or a twin in another language, of a verified question);
    a hit is right when the reused SQL returns the item's gold rows."""

    reachable: int = 0
    missed: list[tuple[str, str, float]] = field(default_factory=list)  # reachable, not hit

    @property
    def recall(self) -> float:
        right = self.hits - self.false_hits
        return right / self.reachable if self.reachable else 0.0


async def probe_verified(
    bus: Bus, tenant: str, items: Sequence[EvalItem], *, knowledge_dir: Path, policy_dir: Path,
    threshold: float,
) -> VerifiedProbe:  # fmt: skip
    """Each item against the tenant's verified queries, minus those the leakage guard
    removes (an item that IS a verified question measures nothing)."""
    results = _Results(_gold_runner(GuardClient(bus), tenant,
                                    _database(PolicyStore(policy_dir), tenant)))  # fmt: skip
    knowledge, _ = leakage_guard(KnowledgeStore(knowledge_dir).load(tenant), items)
    vocabulary = vocabulary_for(knowledge)
    verified = {q.id: q for q in knowledge.verified}
    probe = VerifiedProbe(threshold)
    with contextlib.closing(KnowledgeIndex(shared_embedder(), location=":memory:")) as index:
        await asyncio.to_thread(index.sync, knowledge)
        for item in items:
            probe.asked += 1
            reachable = [q for q in verified.values() if await results.answers(q.sql, item)]
            probe.reachable += bool(reachable)
            found = await asyncio.to_thread(
                index.search, tenant, item.question, kinds=["verified"], limit=CANDIDATES
            )
            top = next((h for h in found
                        if reusable(item.question, h.text, h.score, threshold, vocabulary)),
                       None)  # fmt: skip
            if top is not None:
                right = await results.answers(verified[top.ref].sql, item)
                probe.hits += 1
                probe.false_hits += not right
                probe.examples.append((item.question, top.text, top.score, right))
                if right:
                    continue
            if reachable:
                best = next((h for h in await asyncio.to_thread(
                    index.search, tenant, item.question, kinds=["verified"], limit=len(verified)
                ) if h.ref == reachable[0].id), None)  # fmt: skip
                probe.missed.append(
                    (item.question, reachable[0].question, best.score if best else 0.0)
                )
    return probe


class _Results:
    """What each statement returns, run once per probe however often it is asked."""

    def __init__(self, run_sql: Callable[[str], Awaitable[ResultSet]]) -> None:
        self._run_sql = run_sql
        self._memo: dict[str, ResultSet] = {}

    async def of(self, sql: str) -> ResultSet:
        if sql not in self._memo:
            self._memo[sql] = await self._run_sql(sql)
        return self._memo[sql]

    async def answers(self, sql: str, item: EvalItem) -> bool:
        """`sql` returns the rows of one of the item's gold statements."""
        got = await self.of(sql)
        for gold in item.gold:
            if same_result(got, await self.of(gold), order_matters=item.order_matters):
                return True
        return False


def _database(policies: PolicyStore, tenant: str) -> str:
    """The schema the tenant's SQL runs in, or `unknown_tenant` when it has no policy."""
    policy = policies.get(tenant)
    if policy is None or not policy.database:
        raise SwitchyardError(f"no SQL policy for tenant {tenant!r}", code="unknown_tenant")
    return policy.database


def _gold_runner(
    guard: GuardClient, tenant: str, database: str
) -> Callable[[str], Awaitable[ResultSet]]:
    async def gold(sql: str) -> ResultSet:
        verdict = await guard.validate(tenant, sql, database, question=None, trace=None)
        if not verdict.ok:
            reason = verdict.error.reason if verdict.error else "refused"
            raise SwitchyardError(f"gold SQL refused: {reason}", code="rejected_sql")
        rows = await guard.run(tenant, verdict, database, max_rows=10_000, gate=False,
                               trace=None)  # fmt: skip
        if not rows.ok:
            reason = rows.error.reason if rows.error else "failed"
            raise SwitchyardError(f"gold SQL failed: {reason}", code="db_error")
        return ResultSet(rows.columns, rows.rows)

    return gold
