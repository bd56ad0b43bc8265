"""`sy bench sql-grammar`: the Text2SQL generation grammar's size, build time and
decoding cost, on the game-ops demo schema (every view with all its columns, the
policy `sy sql provision` writes).

- size: for 1..MAX_GRAMMAR_VIEWS views, the largest grammar that many demo views make
  (with the conventions' subquery views), its bytes and the least of `rounds` builds.
- mask: llama.cpp's grammar sampler over the SmolLM2 vocabulary (no weights) walking
  a case's statement token by token, ms per token to mask the whole vocabulary (the
  least of `rounds` tries per token: a busy machine only adds time). `floor_ms` is the
  same walk under a grammar of that one statement: what the sampler costs whatever the
  grammar, so the grammar's own cost is the difference.
- decoding (`engine=True`): the CPU engine (its `SY_LLAMACPP_*` settings) answering
  the case's question at temperature 0 under the case's grammar, completion tokens per
  second once the prompt is cached, and the same request without a grammar right after
  it, so that machine noise hits both; medians of `rounds`.

Cases: one view, a two-view join, a three-view chain, and the chain in the largest
five-view grammar that holds it.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from switchyard.bench.stats import Report
from switchyard.engines.base import EngineRequest
from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings, gbnf_literal
from switchyard.engines.model_files import smollm2_gguf
from switchyard.messages.inference import (
    ChatMessage,
    Constraint,
    GrammarConstraint,
    NoConstraint,
    Sampling,
)
from switchyard.sqldb.catalog import BY_NAME, TABLES
from switchyard.sqlguard.policy import Policy
from switchyard.text2sql.grammar import MAX_GRAMMAR_VIEWS, select_grammar

POLICY = Policy(
    database="t_demo",
    exact_columns=True,
    tables={f"t_demo.{t.name}": list(t.columns) for t in TABLES},
)
# The views the game-ops conventions take "the latest day" from (grammar.anchor_views).
ANCHORS = ("agg_dau_daily", "agg_revenue_daily")
CHAIN = ("agg_dau_daily", "regions", "servers")
EXAMPLE = (
    "SELECT regions.name, SUM(agg_revenue_daily.revenue_cents) AS revenue FROM "
    "agg_revenue_daily JOIN servers ON agg_revenue_daily.server_id = servers.server_id "
    "JOIN regions ON servers.region_id = regions.region_id GROUP BY regions.name LIMIT 10"
)


@dataclass(frozen=True)
class Case:
    name: str
    views: tuple[str, ...]  # the grammar's
    question: str
    sql: str  # a statement of the grammar, walked by the mask measurement


def _widest(views: Sequence[str], n: int) -> tuple[str, ...]:
    """The `n` demo views holding `views` whose grammar is the largest."""
    rest = [t.name for t in TABLES if t.name not in views]
    combos = [(*views, *more) for more in itertools.combinations(rest, n - len(views))]
    return max(combos, key=lambda c: len(select_grammar(POLICY, c, subquery_views=ANCHORS)))


def cases() -> list[Case]:
    chain_sql = (
        "SELECT regions.name, SUM(agg_dau_daily.dau) AS dau FROM agg_dau_daily JOIN servers "
        "ON agg_dau_daily.server_id = servers.server_id JOIN regions ON servers.region_id = "
        "regions.region_id WHERE agg_dau_daily.day = (SELECT MAX(day) FROM agg_dau_daily) "
        "GROUP BY regions.name LIMIT 10"
    )
    chain_q = "What was the DAU of each region on the latest day?"
    return [
        Case(
            "1 view", ("players",), "How many players are there per country?",
            "SELECT country, COUNT(*) AS players FROM players GROUP BY country "
            "ORDER BY COUNT(*) DESC LIMIT 10",
        ),
        Case(
            "2-view join", ("players", "servers"),
            "How many players are on each server, by server name?",
            "SELECT servers.name, COUNT(*) AS players FROM players JOIN servers ON "
            "players.server_id = servers.server_id GROUP BY servers.name "
            "ORDER BY COUNT(*) DESC LIMIT 10",
        ),
        Case("3-view chain", CHAIN, chain_q, chain_sql),
        Case(f"3-view chain in {MAX_GRAMMAR_VIEWS} views", _widest(CHAIN, MAX_GRAMMAR_VIEWS),
             chain_q, chain_sql),
    ]  # fmt: skip


@dataclass
class Size:
    views: int
    worst: list[str]  # the views of the largest grammar
    grammar_bytes: int
    build_ms: float


@dataclass
class Decoding:
    case: str
    views: list[str]
    grammar_bytes: int
    mask_ms: float  # mean over the statement's tokens
    mask_max_ms: float
    floor_ms: float
    tokens_per_s: float | None = None
    unconstrained_tokens_per_s: float | None = None
    generated: str | None = None


@dataclass
class GrammarBench(Report):
    rounds: int
    sizes: list[Size] = field(default_factory=list)
    decoding: list[Decoding] = field(default_factory=list)


def grammar_sizes(rounds: int, most: int = MAX_GRAMMAR_VIEWS) -> list[Size]:
    """The largest grammar of 1..`most` demo views (a grammar only grows with its views)."""
    names = [t.name for t in TABLES]
    out = []
    for n in range(1, most + 1):
        worst = max(
            itertools.combinations(names, n),
            key=lambda c: len(select_grammar(POLICY, c, subquery_views=ANCHORS)),
        )
        builds = []
        for _ in range(rounds):
            t = time.perf_counter()
            gbnf = select_grammar(POLICY, worst, subquery_views=ANCHORS)
            builds.append(time.perf_counter() - t)
        out.append(Size(n, list(worst), len(gbnf.encode()), round(min(builds) * 1000, 2)))
    return out


def mask_ms(vocab_model: Any, gbnf: str, sql: str, rounds: int) -> list[float]:
    """ms per token of `sql` for llama.cpp's grammar sampler to mask the vocabulary."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(vocab_model.model)
    size = llama_cpp.llama_vocab_n_tokens(vocab)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        raise ValueError("llama.cpp refused the grammar")
    data = (llama_cpp.llama_token_data * size)()
    per_token = []
    try:
        for token in vocab_model.tokenize(sql.encode(), add_bos=False, special=False):
            best = float("inf")
            for _ in range(rounds):
                for i in range(size):
                    data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
                array = llama_cpp.llama_token_data_array(data, size, -1, False)
                t = time.perf_counter()
                llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
                best = min(best, time.perf_counter() - t)
            if data[token].logit == float("-inf"):
                raise ValueError(f"the grammar refuses {sql!r}")
            per_token.append(best * 1000)
            llama_cpp.llama_sampler_accept(sampler, token)
    finally:
        llama_cpp.llama_sampler_free(sampler)
    return per_token


def _system(views: Sequence[str]) -> str:
    schema = "\n".join(f"{v}({', '.join(BY_NAME[v].columns)})" for v in views)
    return (
        "You write one MySQL SELECT statement that answers the question. Tables:\n"
        f"{schema}\nExample: {EXAMPLE}"
    )


async def _generate(
    engine: LlamaCppEngine, case: Case, constraint: Constraint, max_tokens: int, tag: str
) -> tuple[float, str]:
    """(completion tokens per second, text) of one answer, its prompt already cached."""
    request = EngineRequest(
        request_id=f"bench-grammar-{tag}",
        messages=(
            ChatMessage(role="system", content=_system(case.views)),
            ChatMessage(role="user", content=case.question),
        ),
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        constraint=constraint,
    )
    t = time.perf_counter()
    deltas = [d async for d in engine.generate(request)]
    elapsed = time.perf_counter() - t
    return deltas[-1].completion_tokens / elapsed, "".join(d.text for d in deltas)


async def decoding_speed(
    engine: LlamaCppEngine, case: Case, gbnf: str, rounds: int, max_tokens: int
) -> tuple[float, float, str]:
    """Median tokens/s under `gbnf` and without a grammar, and the text generated."""
    grammar = GrammarConstraint(gbnf=gbnf)
    await _generate(engine, case, NoConstraint(), 1, "warm")  # caches the prompt
    under, free, text = [], [], ""
    for i in range(rounds):
        speed, text = await _generate(engine, case, grammar, max_tokens, f"g{i}")
        under.append(speed)
        free.append((await _generate(engine, case, NoConstraint(), max_tokens, f"f{i}"))[0])
    return statistics.median(under), statistics.median(free), text


def run_grammar_bench(
    rounds: int = 3, *, engine: bool = True, max_tokens: int = 120, vocab_model: Any = None
) -> GrammarBench:
    import llama_cpp

    result = GrammarBench(rounds=rounds, sizes=grammar_sizes(rounds))
    vocab = vocab_model or llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)
    chosen = cases()
    grammars = [select_grammar(POLICY, c.views, subquery_views=ANCHORS) for c in chosen]
    for case, gbnf in zip(chosen, grammars, strict=True):
        walk = mask_ms(vocab, gbnf, case.sql, rounds)
        floor = mask_ms(vocab, f"root ::= {gbnf_literal(case.sql)}\n", case.sql, rounds)
        mean, most, base = statistics.mean(walk), max(walk), statistics.mean(floor)
        result.decoding.append(
            Decoding(
                case.name,
                list(case.views),
                len(gbnf.encode()),
                round(mean, 2),
                round(most, 2),
                round(base, 2),
            )
        )
    if engine:
        asyncio.run(_decode_all(result, chosen, grammars, rounds, max_tokens))
    return result


async def _decode_all(
    result: GrammarBench, chosen: Sequence[Case], grammars: Sequence[str], rounds: int,
    max_tokens: int,
) -> None:  # fmt: skip
    engine = LlamaCppEngine(LlamaCppSettings())
    await engine.start()
    try:
        for row, case, gbnf in zip(result.decoding, chosen, grammars, strict=True):
            under, free, text = await decoding_speed(engine, case, gbnf, rounds, max_tokens)
            row.tokens_per_s, row.unconstrained_tokens_per_s = round(under, 1), round(free, 1)
            row.generated = text
    finally:
        await engine.close()
