"""The review loop and the evaluation harness on the real fleet: an answered question is
read back from RES, verified into the tenant's knowledge and then answered by the
verified path; `evaluate` scores a slice of the evaluation set, leakage-guarded."""

from __future__ import annotations

import shutil
from pathlib import Path

from switchyard.bus.connection import Bus
from switchyard.text2sql.evalrun import evaluate, guarded_copy
from switchyard.text2sql.evaluation import EvalSet
from switchyard.text2sql.knowledge import KnowledgeStore
from switchyard.text2sql.pipeline import FlowOptions
from switchyard.text2sql.review import promote, recent_answers, unqualified
from tests.conftest import REPO
from tests.support.sqlask import ask_question
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import KNOWLEDGE, text2sql_fleet

EVAL_SET = REPO / "evals" / "sql" / "game-ops.yaml"


async def test_review_then_verify_makes_the_verified_path_answer(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path, unique: str
) -> None:
    knowledge = tmp_path / "knowledge"
    shutil.copytree(KNOWLEDGE, knowledge)
    question = "Show DAU for each of the last 3 days"  # answered by the dau metric
    async with text2sql_fleet(bus, nats_url, sqlenv, tmp_path / "index", unique,
                              summary=False, knowledge_dir=knowledge):  # fmt: skip
        _, first = await ask_question(bus, "acme", question)
        assert first.status == "ok" and first.path == "metric", first
        found = await recent_answers(bus, "acme", since=600)
        assert first.request_id in {a.request_id for a in found}
        assert all(a.tenant == "acme" for a in found)
        answer = next(a for a in found if a.request_id == first.request_id)
        store = KnowledgeStore(knowledge)
        query = promote(store, answer, verified_by="alice", database=sqlenv.schema("acme"),
                        tags=["dau"])  # fmt: skip
        assert query.sql == unqualified(first.sql or "", sqlenv.schema("acme"))
        assert sqlenv.schema("acme") not in query.sql
        assert store.load("acme").verified[-1].verified_by == "alice"

        _, again = await ask_question(bus, "acme", question)  # a new knowledge version
    assert again.path == "verified" and again.reference == query.id, again
    assert again.rows == first.rows


def test_leakage_guard_copy_drops_evaluation_questions(tmp_path: Path) -> None:
    items = EvalSet.load(EVAL_SET).items
    removed = guarded_copy(KNOWLEDGE, "acme", items, tmp_path / "k")
    left = KnowledgeStore(tmp_path / "k").load("acme").verified
    assert removed and not {q.id for q in left} & set(removed)
    asked = {i.question.casefold().strip(" ?.") for i in items}
    assert not [q.id for q in left if q.question.casefold().strip(" ?.") in asked]
    assert len(left) + len(removed) == len(KnowledgeStore(KNOWLEDGE).load("acme").verified)


async def test_evaluate_scores_the_verified_and_metric_paths(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path, unique: str
) -> None:
    items = EvalSet.load(EVAL_SET).items
    chosen = [i for i in items if "metric" in i.tags][:3] + [
        i for i in items if "verified_paraphrase" in i.tags
    ][:3]
    async with text2sql_fleet(bus, nats_url, sqlenv, tmp_path / "index", unique,
                              summary=False) as flow:  # fmt: skip
        report, removed = await evaluate(
            bus, "acme", chosen, knowledge_dir=KNOWLEDGE, policy_dir=sqlenv.policy_dir,
            options=FlowOptions(summary=False), pool=flow.settings.sql_pool,
        )  # fmt: skip
    assert len(report.outcomes) == len(chosen)
    assert not report.gold_errors, [(o.item.id, o.gold_error) for o in report.gold_errors]
    paths = {o.item.id: (o.prediction.path, o.correct) for o in report.outcomes}
    assert all(p != "error" for p, _ in paths.values()), paths
    leaked = {q.question for q in KnowledgeStore(KNOWLEDGE).load("acme").verified
              if q.id in removed}  # fmt: skip
    assert leaked <= {i.question for i in chosen}  # only what these items ask is removed
    lo, hi = report.interval
    assert 0.0 <= lo <= report.accuracy <= hi <= 1.0
    # the metric items this harness picks are answered by the metric path, correctly
    for item in chosen[:3]:
        path, correct = paths[item.id]
        if path == "metric":
            assert correct, (item.id, item.question)
