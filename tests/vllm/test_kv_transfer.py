"""A disaggregated pool's KV connector on real vLLM (#39): `VllmSettings.kv_connector`
reaches vLLM's `kv_transfer_config`, and on the CPU build vLLM's `ExampleConnector` (KV
through files) moves a prefill stage's KV to a decode engine that computes none of it.

The two engines run one after the other (a second engine in the process beside the
session's disturbs its metrics, `test_priority.py`): the prefill engine writes the
prompt's KV under the shared path and is closed; the decode engine, fresh (its own prefix
cache empty), loads it and answers as a whole request on one engine does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from switchyard.engines.base import EngineError, EngineRequest
from switchyard.engines.vllm import VllmEngine, kv_transfer_config_kwargs
from switchyard.messages.inference import KvHandoff

from .conftest import engine_settings
from .test_engine import chat, run, text_of

pytestmark = pytest.mark.vllm

PROMPT = "Name three colours of the rainbow, then say which one is the warmest. " * 6


async def answer(engine: VllmEngine, request: EngineRequest) -> tuple[str, int]:
    deltas = await run(engine, request)
    return text_of(deltas), deltas[-1].cached_tokens


async def test_the_kv_connector_reaches_vllm_and_moves_a_prefill_to_a_decode_engine(
    vllm_model: Path, tmp_path: Path
) -> None:
    from vllm.config import KVTransferConfig

    shared = {"shared_storage_path": str(tmp_path / "kv")}
    producer = engine_settings(vllm_model, kv_connector="ExampleConnector",
                               kv_role="kv_producer", kv_connector_extra_config=shared)  # fmt: skip
    kw = kv_transfer_config_kwargs(producer)
    assert kw is not None and KVTransferConfig(**kw).kv_role == "kv_producer"
    assert kv_transfer_config_kwargs(engine_settings(vllm_model)) is None

    whole = chat("kv-whole", PROMPT, max_tokens=8)
    plain = VllmEngine(engine_settings(vllm_model))
    await plain.start()
    try:
        expected, _ = await answer(plain, whole)
    finally:
        await plain.close()

    prefill = VllmEngine(producer)
    try:
        await prefill.start()
    except EngineError as e:  # the connector does not run on this build: say so, typed
        pytest.fail(f"ExampleConnector did not start on vLLM's CPU build: {e}")
    try:
        first = dataclasses.replace(
            whole, request_id="kv-prefill", kv_producer=True,
            sampling=whole.sampling.model_copy(update={"max_tokens": 1}),
        )  # fmt: skip
        await answer(prefill, first)
    finally:
        await prefill.close()
    assert any((tmp_path / "kv").rglob("*")), "the prefill engine stored no KV"

    decoding = producer.model_copy(update={"kv_role": "kv_consumer"})
    decode = VllmEngine(decoding)
    await decode.start()
    try:
        handoff = KvHandoff(worker="p", tokens=1, prefilled_at=0.0)
        text, loaded = await answer(
            decode, dataclasses.replace(whole, request_id="kv-decode", handoff=handoff)
        )
    finally:
        await decode.close()
    # Its prefix cache was empty: what it counts as computed came through the connector.
    assert loaded > 0
    assert text == expected
