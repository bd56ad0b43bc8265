"""The `Engine` protocol every backend implements, and the request it runs.

An `EngineRequest` is the engine-facing view of a `GenerateRequest`: the same
messages, images, sampling and constraint, without bus concerns. Engines
stream `Delta`s; the last one has a `finish_reason`. An engine that models what
a request cost, apart from this machine's wall clock (the simulator), says so by
also implementing `ModelsCost`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from switchyard.errors import ErrorCode, SwitchyardError
from switchyard.messages.inference import (
    ChatMessage,
    Constraint,
    FinishReason,
    GenerateRequest,
    Image,
    ImagePart,
    KvHandoff,
    ModelledTimings,
    NoConstraint,
    Sampling,
)

EngineKind = Literal["vllm", "llamacpp", "sim"]
# The priority of a request without a due time: after any Unix time in ms (~1.8e12 now),
# and within the int64 vLLM's engine core serialises priorities as (msgpack).
NO_DUE = 2**62
SchedulingPolicy = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority")


class EngineError(SwitchyardError):
    """A request the engine cannot run (bad schema, too long, unknown LoRA) or a broken engine."""

    code: ErrorCode = "engine_error"


class EngineDead(EngineError):
    """The engine itself is gone (vLLM's EngineCore died): no request will run on it again.

    The worker stops taking work, hands back what has not begun, answers what has with
    this error, and exits non-zero so its supervisor restarts it."""


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    images: tuple[Image, ...] = ()
    sampling: Sampling = field(default_factory=Sampling)
    constraint: Constraint = field(default_factory=NoConstraint)
    lora: str | None = None
    cache_salt: str | None = None
    deadline: float | None = None  # absolute Unix seconds
    tenant: str = ""
    session: str | None = None  # lets a pool of engine instances keep a session warm
    # When its answer stops being of use (`GenerateRequest.due`: the deadline or the frame
    # going stale), Unix seconds: what an engine scheduling by priority orders by.
    due: float | None = None
    # A decode stage (#39): the prompt's KV is the prefill worker's, moved here, not computed.
    handoff: KvHandoff | None = None
    # A prefill stage (#39): its KV is kept for a decode stage on another engine.
    kv_producer: bool = False

    @property
    def priority(self) -> int:
        """Earliest deadline first as vLLM's request priority (lower runs first; equal
        priorities run in arrival order): the due time in milliseconds, and one without a
        due time after every one with (`NO_DUE`)."""
        return NO_DUE if self.due is None else int(self.due * 1000)

    def loose_images(self) -> list[Image]:
        """Images that no message part refers to (engines attach them to the last user turn)."""
        named = {
            part.hash
            for m in self.messages or ()
            if not isinstance(m.content, str)
            for part in m.content
            if isinstance(part, ImagePart)
        }
        return [img for img in self.images if img.hash not in named]

    @classmethod
    def from_generate(cls, req: GenerateRequest) -> EngineRequest:
        return cls(
            request_id=req.id,
            messages=tuple(req.messages) if req.messages is not None else None,
            prompt=req.prompt,
            images=tuple(req.images),
            sampling=req.sampling,
            constraint=req.constraint,
            lora=req.lora,
            cache_salt=req.cache_salt,
            deadline=req.deadline,
            tenant=req.tenant,
            due=req.due(),
            session=req.session,
            handoff=req.handoff,
        )


@dataclass(frozen=True)
class Delta:
    """New text since the previous delta, and running token counts."""

    text: str
    completion_tokens: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    # A prefill stage's last delta (#39): the engine's parameters for moving its KV to the
    # decode stage (vLLM's `kv_transfer_params`); None where the engine needs none (sim).
    kv_transfer_params: dict[str, Any] | None = None
    # On the first delta that carries text: the wall seconds the engine held the request
    # before it first scheduled it (a batch slot, KV blocks, a free instance), which the
    # worker's phases tell apart from prefill; None where the engine does not say (vLLM).
    queued: float | None = None


@dataclass(frozen=True)
class EngineStats:
    kv_cache_usage: float = 0.0  # 0-1
    waiting: int = 0
    running: int = 0
    prefix_queried_tokens: int = 0  # cumulative
    prefix_hit_tokens: int = 0  # cumulative
    kv_capacity_tokens: int = 0  # the KV cache's size in tokens (0: not known)
    # Running requests preempted (their KV freed, recomputed later), cumulative; None
    # where the engine does not count them.
    preemptions: int | None = None

    @property
    def prefix_hit_rate(self) -> float:
        if not self.prefix_queried_tokens:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_queried_tokens


@dataclass(frozen=True)
class ModelInfo:
    """What an engine runs, as its request logs name it: the model and the version of its
    weights the engine can tell (a checkpoint's commit, a GGUF's content hash, the sim's
    calibration)."""

    name: str
    version: str


@dataclass(frozen=True)
class Capabilities:
    vision: bool
    json_schema: bool
    grammar: bool
    regex: bool
    lora: bool
    max_context: int


@runtime_checkable
class Engine(Protocol):
    kind: EngineKind
    capabilities: Capabilities

    @property
    def slots(self) -> int:
        """Sequences it runs at once; the worker's heartbeat advertises them and the router
        gives the worker that much credit."""

    @property
    def model(self) -> ModelInfo:
        """The model it runs (final once `start` has returned)."""

    async def start(self) -> None:
        """Load weights; raises `EngineError` with a clear reason when it cannot."""

    def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Stream deltas; the last carries `finish_reason` (`abort` after `abort()`)."""

    async def abort(self, request_id: str) -> None:
        """Stop a queued or running request; its stream ends with `finish_reason='abort'`."""

    def stats(self) -> EngineStats: ...

    async def close(self) -> None: ...


@runtime_checkable
class ModelsCost(Protocol):
    """An engine whose time model says what each request cost (`isinstance` tells)."""

    def modelled_timings(self, request_id: str) -> ModelledTimings | None:
        """The modelled cost of a finished request; None once it is forgotten."""
