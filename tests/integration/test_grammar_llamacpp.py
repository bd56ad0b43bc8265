"""SmolLM2 on the real llamacpp engine, constrained by a policy's SELECT grammar:
what it writes is SQL the validator accepts, a chain of two JOINs included; and the
grammar's benchmark (`sy bench sql-grammar`) at test size."""

from __future__ import annotations

import re
import statistics
from collections.abc import AsyncIterator

import pytest

from switchyard.bench import sqlgrammar
from switchyard.engines.base import EngineRequest
from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings, gbnf_literal
from switchyard.engines.model_files import smollm2_gguf
from switchyard.messages.inference import ChatMessage, GrammarConstraint, Sampling
from switchyard.sqldb.catalog import BY_NAME, TABLES
from switchyard.sqlguard import Policy, validate
from switchyard.text2sql.grammar import choose_views, select_grammar

llama_cpp = pytest.importorskip("llama_cpp")

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


CHAIN_QUESTION = "What was the DAU of each region on the latest day?"
# A chain over other views, so that the model has the shape but not the answer.
CHAIN_EXAMPLE = (
    "SELECT regions.name, SUM(agg_revenue_daily.revenue_cents) AS revenue FROM "
    "agg_revenue_daily JOIN servers ON agg_revenue_daily.server_id = servers.server_id "
    "JOIN regions ON servers.region_id = regions.region_id GROUP BY regions.name LIMIT 10"
)


async def test_a_chain_of_two_joins_is_generated_and_validates(engine: LlamaCppEngine) -> None:
    """DAU by region reads agg_dau_daily -> servers -> regions: choose_views picks the
    three (two it names, one that links them), and under their grammar the model
    writes the chain, which the validator accepts."""
    columns = {t.name: t.columns for t in TABLES}
    ranked = ["agg_dau_daily", *(v for v in columns if v != "agg_dau_daily")]  # by retrieval
    views = choose_views(CHAIN_QUESTION, ranked, columns)
    assert views == ["agg_dau_daily", "regions", "servers"]
    gbnf = select_grammar(POLICY, views, subquery_views=["agg_dau_daily"])
    schema = "\n".join(f"{v}({', '.join(BY_NAME[v].columns)})" for v in views)
    system = (
        "You write one MySQL SELECT statement that answers the question. Tables:\n"
        f"{schema}\nExample: {CHAIN_EXAMPLE}"
    )
    request = EngineRequest(
        request_id="sql-chain",
        messages=(
            ChatMessage(role="system", content=system),
            ChatMessage(role="user", content=CHAIN_QUESTION),
        ),
        sampling=Sampling(max_tokens=160, temperature=0.0),
        constraint=GrammarConstraint(gbnf=gbnf),
    )
    deltas = [d async for d in engine.generate(request)]
    sql = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop", sql
    verdict = validate(sql, POLICY)
    assert verdict.ok, (sql, verdict.rule, verdict.detail)
    assert sql.count(" JOIN ") == 2, sql
    for view in views:
        assert re.search(rf"(FROM|JOIN) {view}\b", sql), (view, sql)


async def test_the_grammar_bench_measures_what_it_says(engine: LlamaCppEngine) -> None:
    """`sy bench sql-grammar` at test size: its largest grammars are the ones
    select_grammar builds and grow with the views, its mask walks statements their
    grammar holds (and refuses one it does not), and decoding is timed under a grammar
    and without one."""
    sizes = sqlgrammar.grammar_sizes(1, most=3)
    assert [s.views for s in sizes] == [1, 2, 3]
    assert sizes[0].grammar_bytes < sizes[1].grammar_bytes < sizes[2].grammar_bytes
    for size in sizes:
        gbnf = select_grammar(sqlgrammar.POLICY, size.worst, subquery_views=sqlgrammar.ANCHORS)
        assert size.grammar_bytes == len(gbnf.encode()) and size.build_ms > 0
    vocab = llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)
    cases = sqlgrammar.cases()
    grammars = [
        select_grammar(sqlgrammar.POLICY, c.views, subquery_views=sqlgrammar.ANCHORS) for c in cases
    ]
    for case, gbnf in zip(cases, grammars, strict=True):
        assert validate(case.sql, sqlgrammar.POLICY).ok, case.sql
        walk = sqlgrammar.mask_ms(vocab, gbnf, case.sql, 1)
        assert len(walk) > 10 and min(walk) > 0
    # The decoding bound: in the widest grammar the mask stays near what any grammar
    # costs (measured: 1.3x on average, 7x at the first token), where one scope per
    # grammar, united, reached 35x at the first token with all 14 views.
    widest = cases[-1]
    walk = sqlgrammar.mask_ms(vocab, grammars[-1], widest.sql, 3)
    floor = sqlgrammar.mask_ms(vocab, f"root ::= {gbnf_literal(widest.sql)}\n", widest.sql, 3)
    assert statistics.mean(walk) < 2 * statistics.mean(floor), (walk, floor)
    assert max(walk) < 20 * statistics.mean(floor), (walk, floor)
    chain = cases[2]
    with pytest.raises(ValueError, match="refuses"):  # the walk checks every token
        sqlgrammar.mask_ms(vocab, grammars[0], chain.sql, 1)
    under, free, text = await sqlgrammar.decoding_speed(engine, chain, grammars[2], 1, 24)
    assert under > 0 and free > 0 and text.startswith("SELECT "), text
