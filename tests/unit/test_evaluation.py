"""Execution-accuracy evaluation: result comparison, the Wilson interval, the run
(with a broken gold), the leakage guard, and the evaluation set file itself."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from switchyard.sqldb.cells import Cell
from switchyard.text2sql.evaluation import (
    EvalItem,
    EvalSet,
    EvalSetError,
    Prediction,
    ResultSet,
    leakage_guard,
    render_report,
    run_evaluation,
    same_result,
    wilson,
)
from switchyard.text2sql.knowledge import KnowledgeStore, TenantKnowledge, VerifiedQuery
from switchyard.text2sql.normalise import normalise_question
from tests.conftest import REPO

EVAL_SET = REPO / "evals" / "sql" / "game-ops.yaml"


def rs(columns: str, *rows: list[Cell]) -> ResultSet:
    return ResultSet(columns.split(), [list(r) for r in rows])


# -- same_result ------------------------------------------------------------------


def test_row_order_is_ignored_unless_it_matters() -> None:
    gold = rs("day dau", ["2025-01-01", 10], ["2025-01-02", 12])
    swapped = rs("day dau", ["2025-01-02", 12], ["2025-01-01", 10])
    assert same_result(swapped, gold, order_matters=False)
    assert not same_result(swapped, gold, order_matters=True)
    assert same_result(gold, gold, order_matters=True)


def test_columns_match_by_content_not_name_or_position() -> None:
    gold = rs("channel new_players", ["organic", 5], ["referral", 2])
    pred = rs("n ch", [2, "referral"], [5, "organic"])
    assert same_result(pred, gold, order_matters=False)
    assert same_result(pred, gold, order_matters=True) is False  # rows in another order
    assert not same_result(rs("a", [5], [2]), gold, order_matters=False)  # a column short


def test_permutation_is_found_when_columns_hold_the_same_kind_of_values() -> None:
    # Both columns are numbers with overlapping values: only one pairing fits the rows.
    gold = rs("dau new", [10, 3], [3, 1])
    assert same_result(rs("new dau", [3, 10], [1, 3]), gold, order_matters=True)
    assert not same_result(rs("x y", [10, 1], [3, 3]), gold, order_matters=False)


def test_numbers_compare_with_tolerance_and_across_representations() -> None:
    gold = rs("arpu", [0.3333333333])
    assert same_result(rs("arpu", [0.33333333]), gold, order_matters=False)
    assert not same_result(rs("arpu", [0.3334]), gold, order_matters=False)
    # DECIMAL as text, ints as floats, booleans as 0/1: the same numbers.
    assert same_result(rs("rev", ["1234.50"]), rs("rev", [1234.5]), order_matters=False)
    assert same_result(rs("n", [7.0]), rs("n", [7]), order_matters=False)
    assert same_result(rs("n", ["1e3"]), rs("n", [1000]), order_matters=False)
    assert same_result(rs("flag", [True]), rs("flag", [1]), order_matters=False)
    assert not same_result(rs("rev", ["1234.50"]), rs("rev", [1234.6]), order_matters=False)


def test_dates_are_iso_strings_and_datetimes_accept_either_separator() -> None:
    gold = rs("at", ["2025-02-01T10:00:00"])
    assert same_result(rs("at", ["2025-02-01 10:00:00"]), gold, order_matters=False)
    assert not same_result(rs("at", ["2025-02-02 10:00:00"]), gold, order_matters=False)
    assert same_result(rs("d", ["2025-02-01"]), rs("d", ["2025-02-01"]), order_matters=False)


def test_duplicates_count_as_a_multiset() -> None:
    gold = rs("tier", ["starter"], ["starter"], ["whale"])
    assert same_result(rs("t", ["whale"], ["starter"], ["starter"]), gold, order_matters=False)
    assert not same_result(rs("t", ["whale"], ["whale"], ["starter"]), gold, order_matters=False)
    assert not same_result(rs("t", ["whale"], ["starter"]), gold, order_matters=False)


def test_nulls_equal_only_nulls() -> None:
    gold = rs("last_login", [None], ["2025-01-01"])
    assert same_result(rs("x", ["2025-01-01"], [None]), gold, order_matters=False)
    assert not same_result(rs("x", ["2025-01-01"], [0]), gold, order_matters=False)
    assert not same_result(rs("x", ["2025-01-01"], [""]), gold, order_matters=False)


def test_empty_results() -> None:
    assert same_result(rs("a b"), rs("x y"), order_matters=False)
    assert not same_result(rs("a"), rs("x y"), order_matters=False)
    assert not same_result(rs("a", [1]), rs("a"), order_matters=False)


def test_values_on_either_side_of_a_rounding_digit_still_match() -> None:
    # 0.12345649999 and 0.1234565 round to different 6-digit keys but are within 1e-6.
    gold = rs("v k", [0.1234565, "a"], [0.5, "b"])
    pred = rs("v k", [0.5, "b"], [0.12345649999, "a"])
    assert same_result(pred, gold, order_matters=False)


# -- wilson -------------------------------------------------------------------------

# Reference: scipy.stats.binomtest(k, n).proportion_ci(0.95, method="wilson"), which
# uses z = 1.959964; the default z = 1.96 agrees to 1e-4.
WILSON_REFERENCE = [
    (0, 10, 0.0, 0.277533),
    (5, 10, 0.236593, 0.763407),
    (10, 10, 0.722467, 1.0),
    (81, 100, 0.722212, 0.874852),
    (45, 150, 0.232408, 0.377580),
]


@pytest.mark.parametrize(("k", "n", "low", "high"), WILSON_REFERENCE)
def test_wilson_matches_reference_values(k: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_edges() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(5, 10, z=1.959964)
    assert lo == pytest.approx(0.236593, abs=1e-6) and hi == pytest.approx(0.763407, abs=1e-6)
    with pytest.raises(ValueError):
        wilson(11, 10)


# -- run_evaluation -----------------------------------------------------------------


def item(
    id_: str, *gold: str, category: str = "activity", tags: list[str] | None = None
) -> EvalItem:
    return EvalItem(
        id=id_, question=f"question {id_}", category=category, intent="metric",
        gold=list(gold), tags=tags or [],
    )  # fmt: skip


async def test_run_evaluation_scores_reports_broken_gold_and_answer_errors() -> None:
    results = {"SELECT 1": rs("x", [1]), "SELECT 2": rs("x", [2])}
    gold_calls: Counter[str] = Counter()

    async def gold(sql: str) -> ResultSet:
        gold_calls[sql] += 1
        if sql == "BROKEN":
            raise RuntimeError("explain.full_scan")
        return results[sql]

    async def answer(it: EvalItem) -> Prediction:
        if it.id == "boom":
            raise TimeoutError("no reply")
        value = 2 if it.id == "wrong" else 1
        return Prediction(sql="...", result=rs("y", [value]), path="generated", seconds=0.5)

    items = [
        item("right", "SELECT 2", "SELECT 1", tags=["metric"]),  # any gold may match
        item("wrong", "SELECT 1", category="revenue"),
        item("broken", "BROKEN", "SELECT 1", category="revenue"),  # matches, but gold broke
        item("boom", "SELECT 1", tags=["metric"]),
    ]
    report = await run_evaluation(items, answer, gold, concurrency=3)

    by_id = {o.item.id: o for o in report.outcomes}
    assert [o.item.id for o in report.outcomes] == ["right", "wrong", "broken", "boom"]
    assert by_id["right"].correct and not by_id["wrong"].correct
    assert not by_id["broken"].correct
    assert by_id["broken"].gold_error and "explain.full_scan" in by_id["broken"].gold_error
    assert [o.item.id for o in report.gold_errors] == ["broken"]
    boom = by_id["boom"].prediction
    assert not by_id["boom"].correct and boom.path == "error" and "no reply" in (boom.error or "")
    assert report.accuracy == 0.25 and report.interval == wilson(1, 4)
    assert report.by_category == {"activity": (1, 2), "revenue": (0, 2)}
    assert report.by_path == {"error": (0, 1), "generated": (1, 3)}
    assert report.by_tag == {"metric": (1, 2)}
    assert gold_calls["SELECT 1"] == 1  # shared gold runs once per evaluation

    console = Console(width=120, record=True)
    console.print(render_report(report))
    text = console.export_text()
    assert "25.0% (1/4)" in text and "by category" in text and "by answer path" in text
    assert "by tag" in text and "broken" in text


async def test_run_evaluation_of_nothing() -> None:
    async def never(_: object) -> ResultSet:
        raise AssertionError

    report = await run_evaluation([], never, never)  # type: ignore[arg-type]
    assert report.outcomes == [] and report.accuracy == 0.0 and report.interval == (0.0, 1.0)


# -- leakage guard ------------------------------------------------------------------


def knowledge_with(*questions: str) -> TenantKnowledge:
    verified = [
        VerifiedQuery(
            id=f"vq-{i}",
            question=q,
            sql="SELECT 1",
            verified_by="alice",
            verified_at=dt.datetime(2026, 11, 20, tzinfo=dt.UTC),
        )
        for i, q in enumerate(questions)
    ]
    return TenantKnowledge(
        tenant="acme", pack="game-ops", views=[], semantics="", metrics=[], verified=verified
    )


def test_leakage_guard_removes_verified_queries_that_are_eval_questions() -> None:
    knowledge = knowledge_with(
        "What was DAU yesterday?", "How many players registered yesterday?", "Revenue by channel"
    )
    items = [
        item("a", "SELECT 1").model_copy(update={"question": "  what was  DAU yesterday "}),
        item("b", "SELECT 1").model_copy(update={"question": "«Revenue by channel»"}),
        item("c", "SELECT 1").model_copy(update={"question": "New sign-ups yesterday?"}),
    ]
    kept, removed = leakage_guard(knowledge, items)
    assert removed == ["vq-0", "vq-2"]
    assert [q.id for q in kept.verified] == ["vq-1"]
    assert len(knowledge.verified) == 3  # the input is not modified
    same, none = leakage_guard(knowledge, items[2:])
    assert none == [] and same is knowledge


def test_normalise_question() -> None:
    assert normalise_question("  What was\tDAU\n yesterday?? ") == "what was dau yesterday"
    assert normalise_question("ＤＡＵ　today") == "dau today"  # full-width forms (NFKC)
    assert normalise_question("¿Revenue in $?") == "revenue in $"  # symbols stay
    assert normalise_question('"ARPU, D1-retention"') == "arpu, d1-retention"


# -- the evaluation set file ---------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    return path


def test_eval_set_refuses_duplicate_ids_missing_gold_and_unknown_keys(tmp_path: Path) -> None:
    one = "  - {id: ev-1, question: q, category: activity, intent: metric, gold: ['SELECT 1']}\n"
    assert len(EvalSet.load(write(tmp_path, "items:\n" + one)).items) == 1
    with pytest.raises(EvalSetError, match=r"duplicate item ids.*ev-1"):
        EvalSet.load(write(tmp_path, "items:\n" + one + one))
    no_gold = "items:\n  - {id: ev-1, question: q, category: activity, intent: metric, gold: []}\n"
    with pytest.raises(EvalSetError, match="gold"):
        EvalSet.load(write(tmp_path, no_gold))
    missing = "items:\n  - {id: ev-1, question: q, category: activity, intent: metric}\n"
    with pytest.raises(EvalSetError, match="gold"):
        EvalSet.load(write(tmp_path, missing))
    with pytest.raises(EvalSetError, match="golden"):
        EvalSet.load(write(tmp_path, "items:\n" + one.replace("}", ", golden: x}")))
    with pytest.raises(EvalSetError, match="intent"):
        EvalSet.load(write(tmp_path, "items:\n" + one.replace("metric", "guess")))
    with pytest.raises(EvalSetError, match="cannot read"):
        EvalSet.load(tmp_path / "absent.yaml")


def test_the_game_ops_eval_set_is_broad_enough() -> None:
    items = EvalSet.load(EVAL_SET).items
    assert len(items) >= 150
    assert len({i.category for i in items}) >= 6
    assert {i.intent for i in items} == {"metric", "lookup", "trend", "breakdown"}
    tags = Counter(t for i in items for t in i.tags)
    assert tags["verified_paraphrase"] >= 8 and tags["metric"] >= 8
    assert sum(len(i.gold) > 1 for i in items) >= 20  # several acceptable answers
    assert len({normalise_question(i.question) for i in items}) == len(items)


def test_verified_paraphrases_reuse_verified_sql_and_metric_items_reuse_metric_sql() -> None:
    knowledge = KnowledgeStore(REPO / "deploy" / "knowledge").load("acme")
    verified = {q.sql: q for q in knowledge.verified}
    rendered = {m.render() for m in knowledge.metrics}
    items = EvalSet.load(EVAL_SET).items
    for it in items:
        if "verified_paraphrase" in it.tags:
            matches = [verified[g] for g in it.gold if g in verified]
            assert matches, it.id  # the same answer as a verified query...
            asked = normalise_question(it.question)
            assert all(normalise_question(q.question) != asked for q in matches), it.id
        if "metric" in it.tags:
            assert rendered & set(it.gold), it.id
