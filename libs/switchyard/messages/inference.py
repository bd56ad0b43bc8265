"""Inference messages: the generate request the router schedules, its result,
the token frames streamed to a reply inbox, and cancellation."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StringConstraints, model_validator

from switchyard.envelope import (
    Envelope,
    Model,
    RequestId,
    SessionId,
    ShortText,
    Text,
    Token,
    UnixTime,
)
from switchyard.errors import ErrorCode
from switchyard.messages.agent import MAX_CHUNK, MAX_THOUGHT_CHARS, Action, ActionFormat
from switchyard.vlmgeometry import VlmName

Workload = Literal["agent", "sql", "llm"]
# A client clock further off than a day is broken, not skewed: offsets are clamped to it.
MAX_CLOCK_OFFSET = 86_400.0
ContentHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,64}$")]


class TextPart(Model):
    type: Literal["text"] = "text"
    text: Text


class ImagePart(Model):
    """A reference to one of the request's images by content hash."""

    type: Literal["image"] = "image"
    hash: ContentHash


class ChatMessage(Model):
    role: Literal["system", "user", "assistant"]
    content: Text | Annotated[list[TextPart | ImagePart], Field(max_length=64)]


class Image(Model):
    """A prepared frame: the re-encoded bytes and the hash of its pixels.

    The hash is the multimodal uuid vLLM uses for its encoder and prefix caches,
    so the same frame must always carry the same hash.
    """

    hash: ContentHash
    data: bytes = Field(max_length=8 * 1024 * 1024)
    mime: Literal["image/png", "image/jpeg", "image/webp"]
    width: int = Field(ge=1, le=16384)
    height: int = Field(ge=1, le=16384)


class Sampling(Model):
    max_tokens: int = Field(default=256, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: Annotated[list[ShortText], Field(max_length=8)] = []


class NoConstraint(Model):
    type: Literal["none"] = "none"


class JsonObjectConstraint(Model):
    type: Literal["json_object"] = "json_object"


class JsonSchemaConstraint(Model):
    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any]


class GrammarConstraint(Model):
    """A GBNF grammar (llama.cpp's format; vLLM's xgrammar backend accepts it too)."""

    type: Literal["grammar"] = "grammar"
    gbnf: Annotated[str, StringConstraints(max_length=64 * 1024)]


class RegexConstraint(Model):
    type: Literal["regex"] = "regex"
    pattern: Annotated[str, StringConstraints(max_length=4096)]


class ChoiceConstraint(Model):
    """The output is exactly one of `choices` (a label, a yes/no, a route)."""

    type: Literal["choice"] = "choice"
    choices: Annotated[list[ShortText], Field(min_length=1, max_length=64)]


class ActionsConstraint(Model):
    """An agent step's answer: up to `chunk` actions in `action_format`, a thought first
    when `thought` allows one (`switchyard.agentactions` holds both languages).

    Named, not spelled out as a grammar, so that every engine enforces the same language
    its own way (GBNF on llama.cpp, a regex on vLLM, the sim writes a valid answer) and
    the worker knows how to parse, check and map the answer.
    """

    type: Literal["actions"] = "actions"
    action_format: ActionFormat = "json"
    chunk: int = Field(default=1, ge=1, le=MAX_CHUNK)
    thought: bool = False


Constraint = Annotated[
    NoConstraint
    | JsonObjectConstraint
    | JsonSchemaConstraint
    | GrammarConstraint
    | RegexConstraint
    | ChoiceConstraint
    | ActionsConstraint,
    Field(discriminator="type"),
]


class ChatRequest(Envelope):
    """An OpenAI-style chat request as a client publishes it on `llm.in.<tenant>` (and the
    edge records it on `llm.edge.<tenant>`, having prepared it for REQ itself)."""

    kind: Literal["llm.chat"] = "llm.chat"
    model: ShortText = "default"
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)]
    sampling: Sampling = Sampling()
    constraint: Constraint = NoConstraint()
    stream: bool = True


class FrameGeometry(Model):
    """An agent step's current frame: its original size, the size the model saw, and the
    VLM profile the prompt was laid out for.

    The preprocessor records it so the worker can map the answer's coordinates
    (what the model writes: resized-frame pixels or 0-1000, per `vlm`;
    `switchyard.vlmgeometry`) back to the phone's pixels without guessing.
    """

    orig_width: int = Field(ge=1, le=16384)
    orig_height: int = Field(ge=1, le=16384)
    width: int = Field(ge=1, le=16384)
    height: int = Field(ge=1, le=16384)
    # Absent in messages from before profiles: those were all Qwen2.5-VL's pixels (so not
    # DEFAULT_VLM: a replayed old step must map its answer as it was mapped then).
    vlm: VlmName = "qwen2.5-vl"


# Which part of a request a worker runs (#39): `whole` on a `both` worker; in a pool that
# has `prefill` and `decode` workers, `prefill` (the prompt's KV, one token) and then
# `decode` (the answer, over the KV the prefill left) on two GPUs.
Stage = Literal["whole", "prefill", "decode"]


class KvHandoff(Model):
    """What a prefill stage leaves its decode stage: where the prompt's KV is, how many
    tokens of it the prefill computed (what moves), and the engine's own transfer
    parameters (vLLM's `kv_transfer_params`; opaque here)."""

    worker: Token  # the prefill worker that holds the KV
    tokens: int = Field(ge=0, le=10_000_000)
    prefilled_at: UnixTime
    params: dict[str, Any] = {}


class GenerateRequest(Envelope):
    """What the router schedules from `REQ` and a worker runs from `WORK`.

    Exactly one of `messages` and `prompt`. `prompt_tokens` is the producer's
    estimate, used for admission before any tokenizer runs.
    """

    kind: Literal["generate"] = "generate"
    workload: Workload
    pool: Token = "default"
    model: ShortText = "default"
    messages: Annotated[list[ChatMessage], Field(max_length=256)] | None = None
    prompt: Text | None = None
    # Up to a window layout's frames (`switchyard.agentprompt.MAX_WINDOW`).
    images: Annotated[list[Image], Field(max_length=16)] = []
    sampling: Sampling = Sampling()
    constraint: Constraint = NoConstraint()
    lora: Token | None = None
    cache_salt: ShortText | None = None
    prompt_tokens: int = Field(default=0, ge=0, le=10_000_000)
    # Agent steps: the longest a frame may wait before its action is useless.
    stale_after: float | None = Field(default=None, gt=0, le=3600)
    # Agent steps: the fleet's clock minus the client's, estimated per session by the
    # preprocessor (services/preprocessor/clock.py). `frame_ts` stays on the client's clock
    # (the answer echoes it back for the client to match); `frame_age` adds this, so every
    # staleness check counts on the fleet's clock and a skewed phone is judged fairly.
    clock_offset: float = Field(default=0.0, ge=-MAX_CLOCK_OFFSET, le=MAX_CLOCK_OFFSET)
    # Agent steps: the step's number in its episode (`AgentStep.step`). A higher step of the
    # same (tenant, session) supersedes this one while it has not started (requestpolicy).
    step: int | None = Field(default=None, ge=0)
    stream: bool = True
    # Set by whoever prepared the request (preprocessor, sqlflow): when it left for `REQ`.
    prepared_at: UnixTime | None = None
    # Set by the router: when it admitted the request (for queue timings).
    admitted_at: UnixTime | None = None
    # Set by the router: when it published the request to WORK (router queueing), on
    # which partition, and which worker owned that partition then (its routing decision).
    dispatched_at: UnixTime | None = None
    partition: int | None = Field(default=None, ge=0, le=65535)
    routed_to: ShortText | None = None
    # Agent steps: the current frame's geometry; answers carry original-frame coordinates.
    frame_geometry: FrameGeometry | None = None
    # Agent steps: the KV tokens its session's steps keep cached on their worker at the
    # layout's fullest (system prompt, every frame the layout holds, history, answer), the
    # producer's estimate; the router places a new session where it fits (None: the
    # prompt and the answer).
    kv_window_tokens: int | None = Field(default=None, ge=0, le=10_000_000)
    # Set by the router (`prefill`) and by the prefill worker (`decode`, with its
    # `handoff`, back on `REQ`): which part of the request this message runs.
    stage: Stage = "whole"
    handoff: KvHandoff | None = None

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("exactly one of messages and prompt is required")
        if (self.stage == "decode") != (self.handoff is not None):
            raise ValueError("a decode stage, and only one, carries the prefill's handoff")
        return self

    def frame_age(self, now: float) -> float | None:
        """Seconds since the frame was captured, `now` and the capture on the fleet's clock."""
        return None if self.frame_ts is None else now - (self.frame_ts + self.clock_offset)

    def due(self) -> float | None:
        """When its answer stops being of use, on the fleet's clock: the deadline, or when
        its frame goes stale (`staleness`), whichever comes first; None if neither."""
        stale = (
            None if self.frame_ts is None or self.stale_after is None
            else self.frame_ts + self.clock_offset + self.stale_after
        )  # fmt: skip
        return min((t for t in (self.deadline, stale) if t is not None), default=None)


class Usage(Model):
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)


class ModelledTimings(Model):
    """What a simulated engine's time model says a request cost, in modelled seconds.

    Only the `sim` engine fills these: virtual time at its calibration, free of
    this machine's CPU contention (the wall clock follows it times the delay scale).
    `queue` waits for a batch slot and KV blocks; `prefill` is the first step boundary
    after admission -> first token (the steps carrying its prefill chunks, and those it
    waited through behind earlier prefills); `decode` the rest (alignment to that step
    boundary plus one step per later token); `total` = their sum; `ttft` arrival ->
    first token (None when no token came); `calibration` the GPU preset the figures are
    modelled at (`a100`, `h100`, `rtx5090`; `+custom` when a figure was overridden);
    `gpu` the engine time it used (its share of each step it ran in): a worker's sum is
    its GPU's busy time, where `prefill` + `decode` also count waiting behind others;
    `evicted_active` the KV blocks of active agent sessions (the sim's rule:
    `switchyard.engines.sim`) that its admission evicted, each a prefix that session's
    next step must compute again.
    """

    queue: float = Field(default=0.0, ge=0)
    prefill: float = Field(default=0.0, ge=0)
    decode: float = Field(default=0.0, ge=0)
    total: float = Field(default=0.0, ge=0)
    ttft: float | None = Field(default=None, ge=0)
    calibration: str | None = Field(default=None, max_length=64)
    gpu: float = Field(default=0.0, ge=0)
    evicted_active: int = Field(default=0, ge=0)


class Timings(Model):
    """Seconds. `queue` is admission -> engine start; `ttft` from engine start.

    `router` is admission -> dispatch to WORK (measured, when the router set both
    times); `modelled` is the engine's own modelled cost (the `sim` engine only).
    """

    queue: float = 0.0
    ttft: float | None = None
    tpot: float | None = None
    total: float = 0.0
    router: float | None = None
    modelled: ModelledTimings | None = None


# A request's phases as the worker observes them (`Route.phases`).
Phase = Literal["preprocess", "router_queue", "dispatch", "engine_queue", "prefill", "decode"]
PHASES: tuple[Phase, ...] = get_args(Phase)


class Route(Model):
    """Where a request went and when (absolute Unix seconds), kept with its result.

    `sy trace` lays these out as hops; `sy replay` compares the routing decision
    (pool, partition, routed_to) of a replayed request with the recorded one.
    `routed_to` is the router's choice; the result's `worker` is who ran it (they
    differ after a failover).
    """

    pool: Token
    partition: int | None = None
    routed_to: ShortText | None = None
    created_at: UnixTime
    prepared_at: UnixTime | None = None
    admitted_at: UnixTime | None = None
    dispatched_at: UnixTime | None = None
    started_at: UnixTime | None = None
    first_token_at: UnixTime | None = None
    finished_at: UnixTime

    def hops(self, ended: float) -> dict[str, float]:
        """Seconds per hop, for the hops this request went through (all stamps are one
        fleet's clocks, so the differences mean something on one machine):

        `prepare`: created -> prepared (INGRESS and the preprocessor, when it went that way);
        `to_router`: -> admitted (REQ and the router's intake); `router`: admission ->
        dispatched to WORK; `to_worker`: -> the engine starts; `engine`: start -> finish;
        `back`: finish -> `ended` (the reader had its end frame).
        """
        hops: dict[str, float] = {}
        at = self.created_at
        for hop, stamp in (
            ("prepare", self.prepared_at), ("to_router", self.admitted_at),
            ("router", self.dispatched_at), ("to_worker", self.started_at),
            ("engine", self.finished_at),
        ):  # fmt: skip
            if stamp is not None:
                hops[hop] = max(0.0, stamp - at)
                at = stamp
        hops["back"] = max(0.0, ended - self.finished_at)
        return hops

    def phases(self, engine_queue: float | None = None) -> dict[Phase, float]:
        """Seconds per phase up to its last token: the hops grouped by what the request
        waited for, the engine's hop split at the first token. They sum to
        `finished_at - created_at` (each hop clamped at 0 as in `hops`, so a clock skewed
        between hosts shortens a phase, never makes one negative):

        `preprocess` (hop `prepare`); `router_queue` (`to_router` + `router`: REQ, the
        router's intake and fair queue); `dispatch` (`to_worker`: WORK and the worker's
        pull); `engine_queue` (the engine's own report of how long it held the request
        before scheduling it, `Delta.queued`; absent where it does not say); `prefill`
        (the rest of engine start -> first token); `decode` (first token -> finish). A
        request the engine never started has no engine phases.
        """
        hops = self.hops(self.finished_at)
        phases: dict[Phase, float] = {}
        if "prepare" in hops:
            phases["preprocess"] = hops["prepare"]
        if "to_router" in hops or "router" in hops:
            phases["router_queue"] = hops.get("to_router", 0.0) + hops.get("router", 0.0)
        if "to_worker" in hops:
            phases["dispatch"] = hops["to_worker"]
        if self.started_at is None:
            return phases
        first = self.first_token_at
        to_first = max(0.0, (self.finished_at if first is None else first) - self.started_at)
        if engine_queue is not None:
            phases["engine_queue"] = min(max(0.0, engine_queue), to_first)
        phases["prefill"] = to_first - phases.get("engine_queue", 0.0)
        if first is not None:
            phases["decode"] = max(0.0, self.finished_at - first)
        return phases


class ErrorInfo(Model):
    code: ErrorCode
    reason: Text
    retry_after: float | None = Field(default=None, ge=0)


# `superseded`: a newer step of the same agent session arrived before this one started.
ResultStatus = Literal["ok", "cancelled", "expired", "stale", "superseded", "rejected", "error"]
FinishReason = Literal["stop", "length", "abort", "error"]


class GenerateResult(Envelope):
    """The outcome of one request, on `res.<workload>.<tenant>` and as the final frame."""

    kind: Literal["result"] = "result"
    request_id: RequestId
    workload: Workload
    status: ResultStatus
    text: Text = ""
    finish_reason: FinishReason | None = None
    usage: Usage = Usage()
    timings: Timings = Timings()
    worker: ShortText | None = None
    error: ErrorInfo | None = None
    route: Route | None = None
    # An agent step answered `ok`: what its answer says, parsed once by the worker's output
    # step (services/worker/output.py) and in the phone's pixels; `text` is the same answer
    # as written, in the step's format. None for every other result.
    actions: Annotated[list[Action], Field(min_length=1, max_length=MAX_CHUNK)] | None = None
    thought: Annotated[str, StringConstraints(max_length=MAX_THOUGHT_CHARS)] | None = None


class Cancel(Envelope):
    """Published on `cancel.<request id>` when a client goes away or gives up."""

    kind: Literal["cancel"] = "cancel"
    request_id: RequestId
    reason: ShortText = "client"


class NewestStep(Envelope):
    """Published on `supersede.<tenant>` by the router that admits a session's newer step:
    every step of (`tenant`, `session`) numbered below `step` that has not started is
    answered `superseded`. Routers and workers keep the newest per session
    (`requestpolicy.NewestSteps`); a notice lost on core NATS only lets an old step run."""

    kind: Literal["agent.newest"] = "agent.newest"
    session: SessionId
    step: int = Field(ge=0)


FrameType = Literal["delta", "end", "error"]


class TokenFrame(Model):
    """One frame of a token stream on a core-NATS reply inbox.

    Not an envelope: frames are many and ephemeral. `seq` orders them; the
    stream ends with exactly one `end` (carrying the result) or `error` frame.
    `attempt` is the delivery that produced the frame: when a worker dies
    mid-stream and another takes the request over, its frames start again at
    seq 0 with a higher attempt.
    """

    v: int = 1
    seq: int = Field(ge=0)
    attempt: int = Field(default=1, ge=1)
    type: FrameType
    text: Text = ""
    tokens: int = Field(default=0, ge=0)  # output tokens in `text` (a delta may hold several)
    result: GenerateResult | None = None
    error: ErrorInfo | None = None
    at: UnixTime | None = None
