"""Summaries grounded in facts, end to end on a real NATS, MariaDB and the llama.cpp
engine: with `summary_source=model` the CPU model rephrases the template sentence, and
whatever it says, the answer's summary states no number, date or name absent from its
facts (else it is the template sentence)."""

from __future__ import annotations

from pathlib import Path

from switchyard.bus.connection import Bus
from switchyard.text2sql.facts import template_summary, ungrounded
from switchyard.text2sql.knowledge import KnowledgeStore
from tests.support.sqlask import ask_question
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import KNOWLEDGE, text2sql_fleet

STORE = KnowledgeStore(KNOWLEDGE)


async def test_model_summaries_state_only_the_facts(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path, unique: str
) -> None:
    verified = STORE.load("acme").verified[0]
    questions = [verified.question, "Show DAU for each of the last 14 days"]
    async with text2sql_fleet(bus, nats_url, sqlenv, tmp_path / "index", unique,
                              summary_source="model", summary_max_tokens=40):  # fmt: skip
        for question in questions:
            events, answer = await ask_question(bus, "acme", question, no_cache=True)
            assert answer.status == "ok" and answer.path in ("verified", "metric"), answer
            facts = answer.facts
            assert facts is not None and facts.row_count == len(answer.rows)
            assert answer.summary and answer.summary_source in ("template", "model")
            assert ungrounded(answer.summary, facts, question) == [], answer.summary
            if answer.summary_source == "template":
                assert answer.summary == template_summary(facts, question)
            [stage] = [e for e in events if e.stage == "summary"]
            assert stage.data["source"] == answer.summary_source
            assert stage.data["facts"]["kind"] == facts.kind
            if question.startswith("Show DAU"):
                assert facts.kind == "series" and facts.row_count == 14
