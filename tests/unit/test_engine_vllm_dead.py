"""vLLM's engine core dying becomes `EngineDead`, whatever shape it reaches a request in.

vLLM 0.32 (vllm/v1/engine/async_llm.py): once the EngineCore process is gone,
`AsyncLLM.errored` is True, `generate()` raises `EngineDeadError` (a `VLLMServerError`)
in every request, or `EngineGenerateError` wrapping what the output loop saw first.
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

from switchyard.engines.base import EngineDead, EngineError, EngineRequest
from switchyard.engines.vllm import VllmApi, VllmEngine, VllmSettings, engine_error
from switchyard.messages.inference import ChatMessage


class VLLMServerError(Exception):
    pass


class EngineDeadError(VLLMServerError):  # matched by name: vLLM is imported lazily
    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above).")


class EngineGenerateError(VLLMServerError):
    pass


def test_engine_dead_error_maps_to_engine_dead() -> None:
    err = engine_error(EngineDeadError())
    assert isinstance(err, EngineDead) and err.code == "engine_error"
    assert "engine core died" in err.reason


def test_a_wrapped_death_maps_to_engine_dead() -> None:
    wrapped = EngineGenerateError()
    wrapped.__cause__ = EngineDeadError()
    assert isinstance(engine_error(wrapped), EngineDead)


def test_any_error_of_an_errored_engine_is_its_death() -> None:
    assert not isinstance(engine_error(RuntimeError("zmq closed")), EngineDead)
    assert isinstance(engine_error(RuntimeError("zmq closed"), dead=True), EngineDead)
    refusal = EngineError("bad schema", code="invalid_request")
    assert engine_error(refusal, dead=True) is refusal  # ours already: kept


class Tokenizer:
    def apply_chat_template(self, conversation: list[dict[str, Any]], **kw: Any) -> str:
        return " ".join(str(m["content"]) for m in conversation)


class DyingLLM:
    """Streams one output, then its engine core dies: `errored` flips and the stream
    raises what vLLM's output loop saw (not always an `EngineDeadError`)."""

    def __init__(self, raise_: BaseException) -> None:
        self.errored = False
        self.raise_ = raise_

    async def generate(self, prompt: Any, params: Any, rid: str, **kw: Any) -> AsyncIterator[Any]:
        completion = types.SimpleNamespace(text="Hi", token_ids=[7], finish_reason=None)
        yield types.SimpleNamespace(prompt_token_ids=[1, 2], num_cached_tokens=0,
                                    outputs=[completion], finished=False)  # fmt: skip
        self.errored = True
        raise self.raise_

    async def abort(self, rid: str) -> None:
        return None


def engine_on(llm: Any) -> VllmEngine:
    engine = VllmEngine(VllmSettings(max_pixels=None, limit_mm_per_prompt={}))
    engine._api = VllmApi(
        async_llm=None, engine_args=None, sampling_params=lambda **kw: kw,
        structured_outputs_params=dict, structured_outputs_config=dict, kv_transfer_config=dict,
        output_kind=types.SimpleNamespace(DELTA=1), lora_request=None,
    )  # fmt: skip
    engine._llm, engine._tokenizer = llm, Tokenizer()
    return engine


def request() -> EngineRequest:
    return EngineRequest("r1", messages=(ChatMessage(role="user", content="hello"),))


@pytest.mark.parametrize("raised", [EngineDeadError(), EngineGenerateError(), RuntimeError("x")])
async def test_a_death_mid_stream_is_engine_dead(raised: BaseException) -> None:
    engine = engine_on(DyingLLM(raised))
    texts = []
    with pytest.raises(EngineDead):
        async for delta in engine.generate(request()):
            texts.append(delta.text)
    assert texts == ["Hi"]


async def test_an_errored_engine_refuses_at_once() -> None:
    llm = DyingLLM(RuntimeError("never reached"))
    llm.errored = True
    engine = engine_on(llm)
    with pytest.raises(EngineDead):
        async for _ in engine.generate(request()):
            pass
    assert not engine._inflight  # nothing sent to vLLM
