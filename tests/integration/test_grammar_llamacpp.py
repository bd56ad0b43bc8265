"""SmolLM2 on the real llamacpp engine, constrained by a policy's SELECT grammar:
what it writes is SQL the validator accepts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from switchyard.engines.base import EngineRequest
from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings
from switchyard.messages.inference import ChatMessage, GrammarConstraint, Sampling
from switchyard.sqldb.catalog import BY_NAME, TABLES
from switchyard.sqlguard import Policy, validate
from switchyard.text2sql.grammar import select_grammar

pytest.importorskip("llama_cpp")

POLICY = Policy(
    database="t_acme",
    exact_columns=True,
    tables={f"t_acme.{t.name}": list(t.columns) for t in TABLES},
)
VIEWS = ("agg_dau_daily", "players")
SCHEMA = "\n".join(f"{v}({', '.join(BY_NAME[v].columns)})" for v in VIEWS)
SYSTEM = (
    "You write one MySQL SELECT statement that answers the question. Tables:\n"
    f"{SCHEMA}\n"
    "Example: SELECT day, SUM(dau) AS dau FROM agg_dau_daily GROUP BY day "
    "ORDER BY day DESC LIMIT 7"
)
QUESTIONS = (
    "How many players are there per country?",
    "What was the total DAU on the latest day?",
    "How many players registered after 2024-01-01?",
)


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    e = LlamaCppEngine(LlamaCppSettings(n_ctx=2048, n_threads=2))
    await e.start()
    yield e
    await e.close()


async def test_grammar_constrained_sql_validates(engine: LlamaCppEngine) -> None:
    constraint = GrammarConstraint(gbnf=select_grammar(POLICY, VIEWS))
    finished = []
    for i, question in enumerate(QUESTIONS):
        request = EngineRequest(
            request_id=f"sql-{i}",
            messages=(
                ChatMessage(role="system", content=SYSTEM),
                ChatMessage(role="user", content=question),
            ),
            sampling=Sampling(max_tokens=120, temperature=0.0),
            constraint=constraint,
        )
        deltas = [d async for d in engine.generate(request)]
        sql = "".join(d.text for d in deltas)
        assert sql.startswith("SELECT "), sql
        if deltas[-1].finish_reason == "stop":
            verdict = validate(sql, POLICY)
            assert verdict.ok, (sql, verdict.rule, verdict.detail)
            finished.append(sql)
    assert len(finished) >= 2, finished
