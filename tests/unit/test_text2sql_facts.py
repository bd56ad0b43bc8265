"""A result's facts, the template sentence written from them, the grounding check that
a summary states nothing else, and the pipeline's choice of summary."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.sqlflow.settings import SqlflowSettings
from switchyard.errors import SwitchyardError
from switchyard.messages.inference import ChatMessage
from switchyard.messages.sql import ExecuteReply, ResultFacts, SqlAsk, StageName
from switchyard.text2sql.facts import result_facts, template_summary, ungrounded
from switchyard.text2sql.pipeline import FlowOptions, Pipeline, Run

REGISTERED = "How many players registered yesterday?"
DAU_14 = "Show DAU for each of the last 14 days"


def dau_rows() -> list[list[Any]]:
    rows: list[list[Any]] = [[f"2026-11-{d:02d}", 1203 + (d - 17) * 10] for d in range(17, 31)]
    rows[8][1] = 1402  # 2026-11-25, the highest
    rows[2][1] = 1100  # 2026-11-19, the lowest
    rows[-1][1] = 1340
    return rows


def test_one_value() -> None:
    facts = result_facts(["new_players"], [[451]])
    assert facts.kind == "value" and facts.row_count == 1
    assert [(v.label, v.value) for v in facts.values] == [("new_players", 451)]
    assert template_summary(facts, REGISTERED) == "new_players is 451."


def test_a_row_of_values_with_null_and_decimals() -> None:
    facts = result_facts(["payers", "arppu", "refunds"], [[12, 4.25, None]])
    assert facts.kind == "value" and facts.decimals == 2
    assert template_summary(facts) == "payers is 12; arppu is 4.25; refunds is NULL."


def test_series() -> None:
    facts = result_facts(["day", "dau"], dau_rows())
    assert facts.kind == "series" and facts.measure == "dau" and facts.label == "day"
    assert facts.first and (facts.first.label, facts.first.value) == ("2026-11-17", 1203)
    assert facts.last and (facts.last.label, facts.last.value) == ("2026-11-30", 1340)
    assert facts.high and (facts.high.label, facts.high.value) == ("2026-11-25", 1402)
    assert facts.low and (facts.low.label, facts.low.value) == ("2026-11-19", 1100)
    assert facts.change == 137 and facts.change_pct == 11.4
    assert template_summary(facts, DAU_14) == (
        "dau over 14 days: from 1,203 on 2026-11-17 to 1,340 on 2026-11-30 (+11.4%); "
        "highest 1,402 on 2026-11-25, lowest 1,100 on 2026-11-19."
    )


def test_series_newest_first_datetimes_and_nulls() -> None:
    rows: list[list[Any]] = [
        ["2026-11-03T00:00:00", 7.5],
        ["2026-11-02T00:00:00", None],
        ["2026-11-01T00:00:00", 10.0],
    ]
    facts = result_facts(["day", "revenue"], rows)
    assert facts.kind == "series" and facts.row_count == 3
    assert facts.first and facts.first.label == "2026-11-01" and facts.first.value == 10.0
    assert facts.last and facts.last.value == 7.5 and facts.change_pct == -25.0
    assert "(-25%)" in template_summary(facts)


def test_breakdown_with_shares_and_total() -> None:
    rows: list[list[Any]] = [["DE", 6000], ["US", 12345], ["FR", 3010], ["GB", 8745], [None, 0]]
    facts = result_facts(["country", "revenue"], rows)
    assert facts.kind == "breakdown" and facts.total == 30100 and facts.others == 2
    assert [(s.label, s.value, s.share) for s in facts.top] == [
        ("US", 12345, 41.0), ("GB", 8745, 29.1), ("DE", 6000, 19.9),
    ]  # fmt: skip
    assert template_summary(facts) == (
        "Top country by revenue: US 41% (12,345) of 30,100; then GB 29.1% (8,745), "
        "DE 19.9% (6,000); 2 more."
    )


def test_breakdown_of_a_rate_has_no_total() -> None:
    facts = result_facts(["channel", "d7_retention"], [["organic", 0.4123], ["paid", 0.31]])
    assert facts.kind == "breakdown" and facts.total is None
    assert (
        template_summary(facts) == "Top channel by d7_retention: organic 0.4123; then paid 0.3100."
    )


def test_empty_table_and_truncated() -> None:
    assert result_facts(["x"], []).kind == "empty"
    assert template_summary(result_facts(["x"], [])) == "No rows matched."
    facts = result_facts(["name", "region"], [["a", "eu"], ["b", "us"]], truncated=True)
    assert facts.kind == "table" and facts.truncated
    assert template_summary(facts) == (
        "2 rows of name, region (the first 2 rows only: the result was truncated)."
    )


def test_the_issues_two_summaries_are_ungrounded() -> None:
    one = result_facts(["new_players"], [[451]])
    said = "The answer is 1. The last row of the result set contains only one row..."
    assert ungrounded(said, one, REGISTERED) == ["1"]
    series = result_facts(["day", "dau"], dau_rows())
    said = "A DAU is a 14-day period in a 24-hour calendar."
    assert ungrounded(said, series, DAU_14) == ["24"]  # 14 is the question's


def test_grounded_rephrasings_pass() -> None:
    one = result_facts(["new_players"], [[451]])
    assert ungrounded("451 players registered yesterday.", one, REGISTERED) == []
    series = result_facts(["day", "dau"], dau_rows())
    for said in (
        template_summary(series, DAU_14),
        "Over the last 14 days DAU rose 11% from 1203 on Nov 17 to 1,340.0 on November 30th, "
        "peaking at 1,402 on 2026-11-25.",
        "DAU went up by 137 (+11.4 %).",
    ):
        assert ungrounded(said, series, DAU_14) == [], said
    rows: list[list[Any]] = [["US", 12345], ["DE", 6000], ["FR", 3010], ["GB", 8745]]
    shares = result_facts(["country", "revenue"], rows)
    assert ungrounded("The US leads with 41% of 30,100, ahead of GB.", shares, "") == []


def test_stray_numbers_dates_and_names_are_caught() -> None:
    series = result_facts(["day", "dau"], dau_rows())
    said = "DAU peaked at 1,500 on 2026-11-26 (Dec 3) and fell 12%."
    assert ungrounded(said, series, DAU_14) == ["2026-11-26", "Dec 3", "1,500", "12%"]
    rows: list[list[Any]] = [["US", 12345], ["DE", 6000]]
    shares = result_facts(["country", "revenue"], rows)
    assert ungrounded("Revenue is led by US, then Japan.", shares, "") == ["Japan"]
    servers = result_facts(["name", "dau"], [["ACME-S2", 838], ["ACME-S4", 820], ["ACME-S8", 808]])
    said = template_summary(servers)
    assert "then ACME-S4" in said and ungrounded(said, servers) == [], said
    assert ungrounded("Led by ACME-S2, then ACME-S9.", servers) == ["ACME-S9"]


# Capitalised hyphenated labels too: the demo's servers are ACME-S1..S8.
LABELS = ["US", "DE", "organic", "Paid Ads", "eu-west", "ACME-S4", "CN-East"]


def test_every_template_sentence_is_grounded_in_its_own_facts() -> None:
    rnd = random.Random(7)
    makers: dict[str, Callable[[], Any]] = {
        "int": lambda: rnd.randint(-5, 10**7),
        "float": lambda: round(rnd.uniform(-100, 10**5), rnd.randint(0, 4)),
        "str": lambda: rnd.choice(LABELS),
        "date": lambda: f"2026-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d}",
        "datetime": lambda: f"2026-11-{rnd.randint(1, 28):02d}T{rnd.randint(0, 23):02d}:00:00",
    }
    names = ["day", "dau", "revenue", "country", "d7_retention", "hour", "n"]
    kinds = set()
    for _ in range(1500):
        types = [rnd.choice(list(makers)) for _ in range(rnd.randint(1, 3))]
        columns = [f"{rnd.choice(names)}{j or ''}" for j in range(len(types))]
        rows = [[None if rnd.random() < 0.1 else makers[t]() for t in types]
                for _ in range(rnd.randint(0, 12))]  # fmt: skip
        facts = result_facts(columns, rows, truncated=rnd.random() < 0.1)
        kinds.add(facts.kind)
        said = template_summary(facts)
        assert ungrounded(said, facts) == [], (said, facts)
    assert kinds == {"value", "series", "breakdown", "table", "empty"}


# -- the pipeline's choice -------------------------------------------------------------


class FakeModel:
    def __init__(self, text: str | None, finish: str = "stop") -> None:
        self.text, self.finish, self.calls = text, finish, 0

    async def complete(self, tenant: str, messages: list[ChatMessage], **_: Any) -> Any:
        self.calls += 1
        if self.text is None:
            raise SwitchyardError("no worker", code="no_capacity")
        assert "Facts:" in messages[-1].content and "Draft:" in messages[-1].content
        return SimpleNamespace(text=self.text, result=SimpleNamespace(finish_reason=self.finish))


async def summarise(
    options: FlowOptions, model: FakeModel, question: str, columns: list[str], rows: list[Any]
) -> tuple[str, str, dict[str, Any], ResultFacts]:
    pipeline = Pipeline(None, None, None, None, model, None, options)  # type: ignore[arg-type]
    events: dict[str, Any] = {}

    async def emit(stage: StageName, seconds: float, data: dict[str, Any]) -> None:
        events[stage] = data

    run = Run(SqlAsk(tenant="acme", question=question), emit, cast(Any, None), cast(Any, None))
    reply = ExecuteReply(tenant="acme", request_id="r1", ok=True, columns=columns, rows=rows)
    facts = result_facts(columns, rows)
    text, source = await pipeline._summary(run, facts, reply)
    return text, source, events["summary"], facts


def test_template_is_the_default() -> None:
    assert FlowOptions().summary_source == "template"
    assert SqlflowSettings().flow_options().summary_source == "template"


async def test_template_source_never_calls_the_model() -> None:
    model = FakeModel("whatever")
    text, source, event, _ = await summarise(FlowOptions(), model, REGISTERED,
                                             ["new_players"], [[451]])  # fmt: skip
    assert (text, source, model.calls) == ("new_players is 451.", "template", 0)
    assert event["facts"]["values"] == [{"label": "new_players", "value": 451}]


@pytest.mark.parametrize(
    ("said", "finish", "expected", "source", "replaced"),
    [
        ("451 players registered yesterday.", "stop", "451 players registered yesterday.",
         "model", False),
        ("Draft: 451 players registered.", "stop", "451 players registered.", "model", False),
        ("The answer is 1. The last row of the result set contains only one row...", "stop",
         "new_players is 451.", "template", True),
        ("451 players registered on 2026-", "length", "new_players is 451.", "template", False),
        (None, "stop", "new_players is 451.", "template", False),  # the model call failed
    ],
)  # fmt: skip
async def test_model_rephrasing_is_checked(
    said: str | None, finish: str, expected: str, source: str, replaced: bool
) -> None:
    options = FlowOptions(summary_source="model")
    text, got, event, _ = await summarise(options, FakeModel(said, finish), REGISTERED,
                                          ["new_players"], [[451]])  # fmt: skip
    assert (text, got) == (expected, source)
    assert event["replaced"] is replaced and event["source"] == source


async def test_sql_ask_json_carries_facts_and_the_summary_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from switchyard.cli.text2sql_commands import _show
    from switchyard.messages.sql import SqlAnswer

    facts = result_facts(["new_players"], [[451]])
    answer = SqlAnswer(
        tenant="acme", request_id="r1", status="ok", path="metric", question=REGISTERED,
        columns=["new_players"], rows=[[451]], summary=template_summary(facts),
        summary_source="template", facts=facts,
    )  # fmt: skip

    async def items() -> Any:
        yield answer

    assert await _show(items(), as_json=True) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"] == "new_players is 451." and printed["summary_source"] == "template"
    assert printed["facts"]["kind"] == "value" and printed["facts"]["values"][0]["value"] == 451


async def test_sql_ask_shows_keepalives_as_no_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """`sy sql ask` prints each stage once; the orchestrator's keepalives between them are
    no stage lines (piped, as here, they draw nothing; on a terminal, one status line)."""
    from switchyard.cli.text2sql_commands import _show
    from switchyard.messages.sql import SqlAnswer, StageEvent, StageProgress

    def beat(tokens: int) -> StageProgress:
        return StageProgress(tenant="acme", request_id="r1", stage="sql", seconds=tokens,
                             elapsed=tokens, tokens=tokens)  # fmt: skip

    async def items() -> Any:
        yield StageEvent(tenant="acme", request_id="r1", stage="scope", data={"mode": "full"})
        for tokens in range(3):
            yield beat(tokens)
        yield StageEvent(tenant="acme", request_id="r1", stage="sql", data={"sql": "SELECT 1"})
        yield SqlAnswer(tenant="acme", request_id="r1", status="ok", path="generated",
                        question="q", sql="SELECT 1")  # fmt: skip

    assert await _show(items(), as_json=False) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = [line.split()[2] for line in lines if " ms " in line]
    assert shown == ["scope", "sql"], lines
    assert not any("working" in line or "tokens" in line for line in lines), lines


async def test_the_evaluation_counts_ungrounded_summaries() -> None:
    from switchyard.text2sql.evaluation import (
        EvalItem,
        Prediction,
        ResultSet,
        render_report,
        run_evaluation,
    )  # fmt: skip

    facts = result_facts(["new_players"], [[451]])
    said = {"good": "451 players registered yesterday.", "bad": "The answer is 1."}
    items = [EvalItem(id=k, question=REGISTERED, category="players", intent="metric",
                      gold=["SELECT 451"]) for k in said]  # fmt: skip
    result = ResultSet(["new_players"], [[451]])

    async def answer(item: EvalItem) -> Prediction:
        return Prediction("SELECT 451", result, "metric", summary=said[item.id], facts=facts)

    async def gold(sql: str) -> ResultSet:
        return result

    report = await run_evaluation(items, answer, gold)
    assert report.accuracy == 1.0 and report.summaries == 2
    assert [(o.item.id, o.ungrounded) for o in report.ungrounded_summaries] == [("bad", ["1"])]
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(render_report(report))
    assert "absent from their facts: 1 of 2" in console.export_text()
