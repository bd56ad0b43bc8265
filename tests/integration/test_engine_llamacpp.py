"""The llamacpp engine against the real SmolLM2 GGUF and real llama.cpp (no mocks)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import jsonschema
import pytest

from switchyard.engines.base import Delta, Engine, EngineError, EngineRequest, ModelInfo
from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings, gguf_version
from switchyard.engines.model_files import smollm2_gguf
from switchyard.engines.pool import EnginePool
from switchyard.messages.inference import (
    ChatMessage,
    ChoiceConstraint,
    Constraint,
    GrammarConstraint,
    ImagePart,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    RegexConstraint,
    Sampling,
    TextPart,
)

llama_cpp = pytest.importorskip("llama_cpp")

ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"enum": ["click", "back"]},
        "x": {"type": "integer"},
        "y": {"type": "integer"},
    },
    "required": ["type", "x", "y"],
}
# Long enough that reusing it is visible: ~300 tokens.
SYSTEM = "You are an agent that plays a game. " + " ".join(
    f"Rule {i}: never click outside the screen, and prefer the back button when lost."
    for i in range(20)
)


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    e = LlamaCppEngine(LlamaCppSettings(n_ctx=2048, n_threads=2))
    await e.start()
    yield e
    await e.close()


@pytest.fixture(scope="module")
def vocab() -> object:
    """An independent tokenizer over the same GGUF, to check the engine's counts."""
    return llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)


_ids = iter(range(1_000_000))


def request(
    user: str = "Name three colours.",
    *,
    system: str | None = None,
    max_tokens: int = 16,
    constraint: Constraint | None = None,
    **sampling: object,
) -> EngineRequest:
    messages = [ChatMessage(role="user", content=user)]
    if system is not None:
        messages.insert(0, ChatMessage(role="system", content=system))
    extra = {"constraint": constraint} if constraint is not None else {}
    return EngineRequest(
        request_id=f"req-{next(_ids)}",
        messages=tuple(messages),
        sampling=Sampling(max_tokens=max_tokens, **sampling),  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


async def collect(engine: LlamaCppEngine, req: EngineRequest) -> list[Delta]:
    return [d async for d in engine.generate(req)]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def chatml(*turns: tuple[str, str]) -> str:
    """SmolLM2's own chat template, written out."""
    body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
    return body + "<|im_start|>assistant\n"


async def test_is_an_engine_with_text_only_capabilities(engine: LlamaCppEngine) -> None:
    assert isinstance(engine, Engine)
    caps = engine.capabilities
    assert (caps.vision, caps.json_schema, caps.grammar, caps.regex, caps.lora) == (
        False,
        True,
        True,
        False,
        False,
    )
    assert caps.max_context == 2048


async def test_chat_streams_deltas_with_token_counts(engine: LlamaCppEngine, vocab: object) -> None:
    req = request(
        "Write a long story about a dragon.", system="You are a storyteller.", max_tokens=12
    )
    deltas = await collect(engine, req)

    assert any(d.text for d in deltas[:-1])
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    last = deltas[-1]
    assert last.finish_reason in ("stop", "length")
    counts = [d.completion_tokens for d in deltas]
    assert counts == sorted(counts) and last.completion_tokens <= 12
    if last.finish_reason == "length":
        assert last.completion_tokens == 12
    # The prompt went through the model's chat template, not a format of ours.
    prompt = chatml(
        ("system", "You are a storyteller."), ("user", "Write a long story about a dragon.")
    )
    expected = vocab.tokenize(prompt.encode(), add_bos=False, special=True)  # type: ignore[attr-defined]
    assert {d.prompt_tokens for d in deltas} == {len(expected)}
    assert engine.stats().running == 0
    assert 0 < engine.stats().kv_cache_usage <= (len(expected) + 12) / 2048


async def test_raw_prompt_is_used_verbatim(engine: LlamaCppEngine, vocab: object) -> None:
    prompt = "The capital of France is"
    req = EngineRequest(request_id="raw", prompt=prompt, sampling=Sampling(max_tokens=4))
    deltas = await collect(engine, req)
    assert deltas[-1].prompt_tokens == len(vocab.tokenize(prompt.encode(), special=True))  # type: ignore[attr-defined]
    assert deltas[-1].completion_tokens == 4


async def test_json_schema_constraint_yields_valid_json(engine: LlamaCppEngine) -> None:
    req = request(
        "The button is at x=10, y=20. Reply with the action as JSON.",
        max_tokens=48,
        constraint=JsonSchemaConstraint(json_schema=ACTION_SCHEMA),
    )
    deltas = await collect(engine, req)
    assert deltas[-1].finish_reason == "stop"
    jsonschema.validate(json.loads(text_of(deltas)), ACTION_SCHEMA)


async def test_json_object_constraint_yields_an_object(engine: LlamaCppEngine) -> None:
    req = request(
        "Describe a cat as a JSON object with keys name and age.",
        max_tokens=48,
        constraint=JsonObjectConstraint(),
    )
    deltas = await collect(engine, req)
    if deltas[-1].finish_reason == "stop":  # else cut off by max_tokens: still a JSON prefix
        assert isinstance(json.loads(text_of(deltas)), dict)
    assert text_of(deltas).lstrip().startswith("{")


async def test_gbnf_constraint(engine: LlamaCppEngine) -> None:
    req = request(
        "Is the sky blue? Answer yes or no.",
        max_tokens=8,
        constraint=GrammarConstraint(gbnf='root ::= ("yes" | "no")'),
    )
    deltas = await collect(engine, req)
    assert text_of(deltas) in ("yes", "no")
    assert deltas[-1].finish_reason == "stop"


async def test_choice_constraint_answers_exactly_one_choice(engine: LlamaCppEngine) -> None:
    # Quotes, backslashes and a newline must reach llama.cpp escaped, as themselves.
    choices = ["red", "dark blue", 'say "green"', "back\\slash", "two\nlines"]
    seen = set()
    for seed in range(6):
        req = request(
            "Pick a colour.",
            max_tokens=16,
            constraint=ChoiceConstraint(choices=choices),
            temperature=1.0,
            seed=seed,
        )
        deltas = await collect(engine, req)
        assert text_of(deltas) in choices
        assert deltas[-1].finish_reason == "stop"
        seen.add(text_of(deltas))
    assert len(seen) > 1  # sampled, not one fixed answer


@pytest.mark.parametrize("temperature", [0.0, 0.9])
async def test_seeded_generation_is_reproducible(
    engine: LlamaCppEngine, temperature: float
) -> None:
    def req() -> EngineRequest:
        return request("Tell me a joke.", max_tokens=16, temperature=temperature, seed=1234)

    first = text_of(await collect(engine, req()))
    await collect(engine, request("Something else in between.", max_tokens=4))
    second = text_of(await collect(engine, req()))
    assert first and first == second


async def test_abort_stops_a_running_generation_fast(engine: LlamaCppEngine) -> None:
    req = request("Count from one to a thousand, in words.", max_tokens=1500)
    stream = engine.generate(req)
    first = await anext(stream)
    assert first.finish_reason is None
    t0 = time.monotonic()
    await engine.abort(req.request_id)
    rest = [d async for d in stream]
    elapsed = time.monotonic() - t0
    assert rest[-1].finish_reason == "abort"
    assert elapsed < 1.0
    assert rest[-1].completion_tokens < 1500
    assert engine.stats().running == 0


async def test_abort_during_prefill(engine: LlamaCppEngine) -> None:
    # A ~1500-token prompt takes seconds to evaluate here; abort must not wait for it.
    req = request("word " * 1500, max_tokens=4)
    task = asyncio.create_task(collect(engine, req))
    while engine.stats().running == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    await engine.abort(req.request_id)
    deltas = await task
    assert time.monotonic() - t0 < 1.0
    assert deltas[-1].finish_reason == "abort"
    assert deltas[-1].completion_tokens == 0


async def test_abort_of_a_waiting_request(engine: LlamaCppEngine) -> None:
    running = request("Count from one to a thousand, in words.", max_tokens=1500)
    waiting = request("This one never runs.", max_tokens=8)
    stream = engine.generate(running)
    await anext(stream)
    queued = asyncio.create_task(collect(engine, waiting))
    while engine.stats().waiting == 0:
        await asyncio.sleep(0.01)
    assert engine.stats().running == 1
    queried = engine.stats().prefix_queried_tokens

    await engine.abort(waiting.request_id)
    deltas = await asyncio.wait_for(queued, 1.0)  # ends while the other still runs
    assert [d.finish_reason for d in deltas] == ["abort"]
    assert deltas[0].completion_tokens == 0
    assert engine.stats().waiting == 0
    assert engine.stats().running == 1

    await engine.abort(running.request_id)
    assert [d async for d in stream][-1].finish_reason == "abort"
    assert engine.stats().prefix_queried_tokens == queried  # the aborted one never started


async def test_abort_before_the_request_arrives(engine: LlamaCppEngine) -> None:
    req = request("Too late.", max_tokens=8)
    await engine.abort(req.request_id)
    deltas = await collect(engine, req)
    assert [d.finish_reason for d in deltas] == ["abort"]


async def test_second_request_waits_its_turn(engine: LlamaCppEngine) -> None:
    a, b = request("First.", max_tokens=32), request("Second.", max_tokens=8)
    ta = asyncio.create_task(collect(engine, a))
    tb = asyncio.create_task(collect(engine, b))
    seen_waiting = 0
    while not (ta.done() and tb.done()):
        stats = engine.stats()
        assert stats.running <= 1
        seen_waiting = max(seen_waiting, stats.waiting)
        await asyncio.sleep(0.005)
    assert seen_waiting == 1
    assert (await ta)[-1].finish_reason in ("stop", "length")
    assert (await tb)[-1].finish_reason in ("stop", "length")


async def test_a_consumer_leaving_early_frees_the_engine(engine: LlamaCppEngine) -> None:
    stream = engine.generate(request("Count to a thousand.", max_tokens=1500))
    await anext(stream)
    await stream.aclose()
    deltas = await asyncio.wait_for(collect(engine, request("Hi.", max_tokens=4)), 5.0)
    assert deltas[-1].finish_reason in ("stop", "length")


async def test_prefix_reuse_between_consecutive_requests(
    engine: LlamaCppEngine, vocab: object
) -> None:
    system_tokens = len(vocab.tokenize(chatml(("system", SYSTEM)).encode(), special=True))  # type: ignore[attr-defined]
    await collect(engine, request("Where is the start button?", system=SYSTEM, max_tokens=4))
    before = engine.stats()
    deltas = await collect(engine, request("Where is the exit?", system=SYSTEM, max_tokens=4))
    after = engine.stats()

    cached = deltas[-1].cached_tokens
    assert cached >= system_tokens - 8  # the whole system turn, give or take the tail
    assert cached < deltas[-1].prompt_tokens
    assert after.prefix_hit_tokens - before.prefix_hit_tokens == cached
    assert after.prefix_queried_tokens - before.prefix_queried_tokens == deltas[-1].prompt_tokens
    assert 0 < after.prefix_hit_rate <= 1


async def test_repeated_frames_form_a_reusable_prefix(engine: LlamaCppEngine) -> None:
    frame = "ab" * 16

    def step(question: str) -> EngineRequest:
        content = [ImagePart(hash=frame), TextPart(text=question)]
        return EngineRequest(
            request_id=f"frame-{next(_ids)}",
            messages=(
                ChatMessage(role="system", content=SYSTEM),
                ChatMessage(role="user", content=content),
            ),
            sampling=Sampling(max_tokens=2),
        )

    await collect(engine, step("What do you see?"))
    deltas = await collect(engine, step("What now?"))
    # Everything up to the question is reused, including the frame's placeholder.
    assert deltas[-1].cached_tokens > deltas[-1].prompt_tokens - 12


async def test_a_new_cache_salt_does_not_reuse_the_prefix(engine: LlamaCppEngine) -> None:
    def salted(salt: str) -> EngineRequest:
        return EngineRequest(
            request_id=f"salt-{next(_ids)}",
            messages=(
                ChatMessage(role="system", content=SYSTEM),
                ChatMessage(role="user", content="Hi"),
            ),
            sampling=Sampling(max_tokens=2),
            cache_salt=salt,
        )

    await collect(engine, salted("tenant-a"))
    assert (await collect(engine, salted("tenant-a")))[-1].cached_tokens > 0
    assert (await collect(engine, salted("tenant-b")))[-1].cached_tokens == 0


async def test_over_the_context_length(engine: LlamaCppEngine) -> None:
    with pytest.raises(EngineError) as err:
        await collect(engine, request("Hello.", max_tokens=2040))
    assert err.value.code == "context_length"
    assert "2048" in err.value.reason

    with pytest.raises(EngineError) as err:
        await collect(engine, request("word " * 2100, max_tokens=1))
    assert err.value.code == "context_length"


@pytest.mark.parametrize(
    "constraint",
    [
        JsonSchemaConstraint(json_schema={"type": "wat"}),
        JsonSchemaConstraint(json_schema={"$ref": "#/definitions/missing"}),
        GrammarConstraint(gbnf='root ::= ("yes" | "no"'),
        GrammarConstraint(gbnf="root ::= undefined-rule"),
        GrammarConstraint(gbnf='start ::= "no root"'),
        GrammarConstraint(gbnf="root ::= root [a]"),
        GrammarConstraint(gbnf="  "),
        RegexConstraint(pattern="[a-z]+"),
    ],
)
async def test_bad_or_unsupported_constraints_are_refused(
    engine: LlamaCppEngine, constraint: Constraint
) -> None:
    with pytest.raises(EngineError) as err:
        await collect(engine, request(constraint=constraint))
    assert err.value.code == "invalid_request"
    assert engine.stats().running == 0
    # ...and the engine (and this process) carry on.
    assert (await collect(engine, request(max_tokens=2)))[-1].finish_reason in ("stop", "length")


async def test_regex_error_names_the_constraint(engine: LlamaCppEngine) -> None:
    with pytest.raises(EngineError, match="regex"):
        await collect(engine, request(constraint=RegexConstraint(pattern="a+")))


async def test_expired_deadline(engine: LlamaCppEngine) -> None:
    req = EngineRequest(
        request_id="late",
        prompt="Hello",
        sampling=Sampling(max_tokens=4),
        deadline=time.time() - 1,
    )
    with pytest.raises(EngineError) as err:
        await collect(engine, req)
    assert err.value.code == "expired"


async def test_deadline_stops_generation(engine: LlamaCppEngine) -> None:
    req = EngineRequest(
        request_id="deadline",
        prompt="Count from one to a thousand:",
        sampling=Sampling(max_tokens=1500),
        deadline=time.time() + 0.5,
    )
    t0 = time.monotonic()
    deltas = await collect(engine, req)
    assert deltas[-1].finish_reason == "abort"
    assert time.monotonic() - t0 < 1.5


async def test_stop_strings_end_the_text(engine: LlamaCppEngine) -> None:
    req = EngineRequest(
        request_id="stops",
        prompt="1, 2, 3, 4, 5, 6,",
        sampling=Sampling(max_tokens=24, stop=[" 9"]),
    )
    deltas = await collect(engine, req)
    text = text_of(deltas)
    assert deltas[-1].finish_reason == "stop"
    assert " 9" not in text and text.strip().startswith("7")


async def test_missing_model_file_fails_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    e = LlamaCppEngine(LlamaCppSettings(model_path=missing))
    with pytest.raises(EngineError, match=str(missing)):
        await e.start()


async def test_a_file_that_is_not_a_gguf_fails_at_start(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model" * 100)
    e = LlamaCppEngine(LlamaCppSettings(model_path=bogus))
    with pytest.raises(EngineError, match="GGUF") as err:
        await e.start()
    assert str(bogus) in err.value.reason


async def test_grammar_errors_say_what_is_wrong(engine: LlamaCppEngine) -> None:
    for gbnf, says in [("root ::= root [a]", "left recursion"), ('start ::= "x"', "root")]:
        with pytest.raises(EngineError, match=says):
            await collect(engine, request(constraint=GrammarConstraint(gbnf=gbnf)))


async def test_close_ends_a_running_generation_and_refuses_new_ones() -> None:
    e = LlamaCppEngine(LlamaCppSettings(n_ctx=2048))
    await e.start()
    stream = e.generate(request("Count from one to a thousand.", max_tokens=1500))
    await anext(stream)
    closing = asyncio.create_task(e.close())
    assert [d async for d in stream][-1].finish_reason == "abort"
    await asyncio.wait_for(closing, 2.0)
    with pytest.raises(EngineError):
        await collect(e, request())


async def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_LLAMACPP_N_CTX", "1024")
    monkeypatch.setenv("SY_LLAMACPP_MODEL_PATH", "/models/x.gguf")
    s = LlamaCppSettings()
    assert s.n_ctx == 1024 and s.model_path == Path("/models/x.gguf") and s.n_threads == 2


async def test_names_its_model_and_the_version_of_its_weights(
    engine: LlamaCppEngine, tmp_path: Path
) -> None:
    gguf = smollm2_gguf()
    assert engine.model == ModelInfo(gguf.stem, gguf_version(gguf))
    assert engine.model.version.startswith("gguf-")
    # Another build of the file is another version.
    other = tmp_path / gguf.name
    other.write_bytes(gguf.read_bytes()[: 2 << 20])
    assert gguf_version(other) != engine.model.version


async def test_a_pool_says_how_long_a_request_waited_for_an_instance(
    engine: LlamaCppEngine,
) -> None:
    pool = EnginePool([engine])  # the module's engine: one sequence at a time

    async def run(stream: AsyncIterator[Delta]) -> list[Delta]:
        return [d async for d in stream]

    holder = pool.generate(request("Count to twenty.", max_tokens=8))
    held = [await anext(holder)]  # it holds the only instance from here
    waiter = asyncio.ensure_future(run(pool.generate(request("Say one word.", max_tokens=4))))
    held += await run(holder)
    waited = [d for d in await waiter if d.text]
    held = [d for d in held if d.text]
    # On the first token's delta only: ~0 for the one that found the instance free, the
    # time it waited for the other (which ran while it waited).
    assert held[0].queued is not None and waited[0].queued is not None
    assert waited[0].queued > held[0].queued
    assert all(d.queued is None for d in [*held[1:], *waited[1:]])
