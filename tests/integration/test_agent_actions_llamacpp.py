"""SmolLM2 on the real llamacpp engine, constrained by an agent step's `ActionsConstraint`
(the GBNF of `agentactions.answer_gbnf`): what it writes is an answer of the step's format,
within the derived max_tokens; the engine counts tokens with the same tokenizer the
budget was measured with. (JSON with one action runs on this engine in test_edge_agent.)"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from services.worker.output import AgentAnswer, Cut, agent_answer
from switchyard.agentactions import (
    ANSWER_INSTRUCTIONS,
    answer_regex,
    answer_token_budget,
    parse_answer_text,
)
from switchyard.engines.base import EngineRequest
from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings
from switchyard.messages.agent import ActionFormat
from switchyard.messages.inference import ActionsConstraint, ChatMessage, Sampling

pytest.importorskip("llama_cpp")

AGENT = "You are an agent that plays a mobile game on a cloud phone."
SCREENS = (
    "A pop-up with a close button at 1180, 40 covers the screen.",
    "The main menu: a PLAY button at 640, 600 and a shop icon at 80, 80.",
)
SHAPES: list[tuple[ActionFormat, int, bool]] = [
    ("compact", 1, False), ("compact", 3, True), ("json", 2, True), ("grid", 1, False),
    ("grid", 3, True),
]  # fmt: skip


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    e = LlamaCppEngine(LlamaCppSettings(n_ctx=2048, n_threads=2))
    await e.start()
    yield e
    await e.close()


def request(rid: str, screen: str, c: ActionsConstraint, max_tokens: int) -> EngineRequest:
    fmt = c.action_format
    return EngineRequest(
        request_id=rid,
        messages=(
            ChatMessage(role="system", content=f"{AGENT} {ANSWER_INSTRUCTIONS[fmt]}"),
            ChatMessage(role="user", content=f"Screen: {screen}\nStep 0: next action?"),
        ),
        sampling=Sampling(max_tokens=max_tokens, temperature=0.7, seed=7),
        constraint=c,
    )


@pytest.mark.parametrize(("fmt", "chunk", "thought"), SHAPES)
async def test_answers_keep_to_the_format_within_the_budget(
    engine: LlamaCppEngine, fmt: ActionFormat, chunk: int, thought: bool
) -> None:
    c = ActionsConstraint(action_format=fmt, chunk=chunk, thought=thought)
    budget = answer_token_budget(fmt, chunk, thought)
    for i, screen in enumerate(SCREENS):
        deltas = [
            d async for d in engine.generate(request(f"{fmt}-{chunk}-{i}", screen, c, budget))
        ]
        text = "".join(d.text for d in deltas)
        last = deltas[-1]
        assert last.finish_reason == "stop", (text, last)
        assert last.completion_tokens <= budget
        out = agent_answer(text, last.finish_reason, c, None)  # the worker's output step
        assert isinstance(out, AgentAnswer), (text, out)
        assert out.answer == parse_answer_text(text, fmt, chunk=chunk, thought=thought)
        assert 1 <= len(out.answer.actions) <= chunk
        assert re.fullmatch(answer_regex(fmt, chunk, thought), text), text


async def test_an_answer_cut_at_max_tokens_is_recognised(engine: LlamaCppEngine) -> None:
    c = ActionsConstraint(action_format="json")
    deltas = [d async for d in engine.generate(request("cut", SCREENS[1], c, 4))]
    text = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 4
    cut = agent_answer(text, "length", c, None)
    assert isinstance(cut, Cut) and cut.reason == "length"
