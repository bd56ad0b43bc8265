"""Game-agent messages: a step as a cloud phone sends it, and the action contract."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, RootModel, StringConstraints

from switchyard.envelope import Envelope, Model, SessionId, ShortText, UnixTime

# A raw upload may be larger than the bus limit would allow for two frames;
# the edge enforces the HTTP cap, this is the bus-level cap per frame.
MAX_FRAME_BYTES = 3 * 1024 * 1024


class RawFrame(Model):
    data: bytes = Field(min_length=1, max_length=MAX_FRAME_BYTES)
    # What the client claims; the preprocessor trusts the decoded format, not this.
    mime: ShortText = "application/octet-stream"


# How an answer is written: `json` objects, `compact` or `grid` lines (`switchyard.agentactions`).
ActionFormat = Literal["json", "compact", "grid"]
# `compact` by default: about half the tokens of `json` per action (README, "Agent steps"),
# the difference between serving phones under 500 ms and serving none.
DEFAULT_ACTION_FORMAT: ActionFormat = "compact"


MAX_CHUNK = 5  # actions per answer at most


class StepOptions(Model):
    chunk: int = Field(
        default=1, ge=1, le=MAX_CHUNK, description="actions per answer (action chunking)"
    )
    thought: bool = Field(default=False, description="allow a very short thought")
    action_format: ActionFormat = Field(
        default=DEFAULT_ACTION_FORMAT,
        description="`json` objects, `compact` lines (`click 520 1180`) or `grid` lines "
        "(`click520380`: 0-999 points, one-digit durations), one action a line",
    )
    # None: what the format and chunk need (`agentactions.answer_token_budget`). A value
    # below that need is raised to it (an answer must never be cut); one above it is
    # allowed up to the preprocessor's `agent_max_tokens`.
    max_tokens: int | None = Field(default=None, ge=8, le=512)


MAX_FRAMES = 2  # a step's frames: the current one, maybe the previous one first


class StepFields(Model):
    """What a client says about one step besides its frames: the fields and caps of every
    encoding (the edge's JSON body and multipart form derive theirs from it, `AgentStep`
    carries them on the bus)."""

    # The envelope's `session`, described: a step without one is an episode of its own
    # (the edge requires one).
    session: SessionId | None = Field(
        default=None, description="episode id (session affinity, KV reuse)"
    )
    # Required for steps: staleness is measured from it.
    frame_ts: UnixTime = Field(description="Unix seconds the (current) frame was captured")
    # The client's clock when it sent the step, for the fleet's estimate of that clock's
    # offset (services/preprocessor/clock.py). Unset, `created_at` stands for it: a client
    # publishing on the bus stamps that from its own clock; the edge copies the HTTP field.
    sent_at: UnixTime | None = Field(
        default=None,
        description="Unix seconds on the client's clock when it sent the step: lets the "
        "fleet estimate that clock's offset, so a skewed clock neither drops nor passes frames",
    )
    step: int = Field(default=0, ge=0)
    stale_after: float = Field(default=2.0, gt=0, le=3600, description="frame age budget, s")
    goal: Annotated[str, StringConstraints(max_length=2048)] = ""
    history: Annotated[
        list[Annotated[str, StringConstraints(max_length=512)]], Field(max_length=256)
    ] = []
    # Real-time chunking's "inpainting" ([S0] 2.3): a phone that sends its next step while
    # a chunk still executes names the actions of that chunk it has yet to finish, so the
    # model plans what follows them instead of repeating them (`agentprompt.pending_text`).
    pending: Annotated[
        list[Annotated[str, StringConstraints(max_length=512)]], Field(max_length=MAX_CHUNK)
    ] = Field(
        default=[],
        description="actions of the current chunk still executing when the frame was "
        "captured: the answer continues after them",
    )
    options: StepOptions = StepOptions()


class AgentStep(StepFields, Envelope):
    """One step of an episode, on `agent.in.<tenant>`: the client's fields and its frames."""

    kind: Literal["agent.step"] = "agent.step"
    frames: Annotated[list[RawFrame], Field(min_length=1, max_length=MAX_FRAMES)]


class Click(Model):
    type: Literal["click"] = "click"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)


class LongPress(Model):
    type: Literal["long_press"] = "long_press"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    ms: int = Field(default=800, ge=1, le=10_000)


class Swipe(Model):
    type: Literal["swipe"] = "swipe"
    x1: int = Field(ge=0, le=16384)
    y1: int = Field(ge=0, le=16384)
    x2: int = Field(ge=0, le=16384)
    y2: int = Field(ge=0, le=16384)
    ms: int = Field(default=300, ge=1, le=10_000)


class TypeText(Model):
    type: Literal["type"] = "type"
    text: Annotated[str, StringConstraints(max_length=256)]


class Back(Model):
    type: Literal["back"] = "back"


class Wait(Model):
    type: Literal["wait"] = "wait"
    ms: int = Field(ge=1, le=60_000)


class Done(Model):
    type: Literal["done"] = "done"


Action = Annotated[
    Click | LongPress | Swipe | TypeText | Back | Wait | Done, Field(discriminator="type")
]

# A thought is a hint for debugging, never reasoning: every token of it is paid
# for in decode time, which is the agent's latency budget.
MAX_THOUGHT_CHARS = 80


class ActionAnswer(RootModel[Action]):
    """The most compact answer: one bare action object (~16 tokens)."""


class ChunkAnswer(Model):
    """An answer with action chunking and/or a short thought."""

    thought: Annotated[str, StringConstraints(max_length=MAX_THOUGHT_CHARS)] | None = None
    actions: Annotated[list[Action], Field(min_length=1, max_length=MAX_CHUNK)]


def answer_schema(chunk: int = 1, thought: bool = False) -> dict[str, Any]:
    """The JSON schema of an agent step's answer in the `json` format, for clients.

    One action without a thought is a bare action object; otherwise an object
    with up to `chunk` actions and, when allowed, a thought capped in length.
    Engines hold the model to a tighter language of the same shape
    (`switchyard.agentactions`: no whitespace, texts of printable ASCII, typed
    text at most 32 characters), so every answer they give validates here.
    """
    if chunk == 1 and not thought:
        return _require_type(ActionAnswer.model_json_schema())
    schema = _require_type(ChunkAnswer.model_json_schema())
    schema["properties"]["actions"]["maxItems"] = max(1, min(chunk, MAX_CHUNK))
    if not thought:
        del schema["properties"]["thought"]
    schema["required"] = ["actions"]
    return schema


def _require_type(schema: dict[str, Any]) -> dict[str, Any]:
    # `type` has a default in the models, so pydantic leaves it optional; a
    # constrained decoder must always emit it or the answer is ambiguous.
    for definition in schema.get("$defs", {}).values():
        if "type" in definition.get("properties", {}):
            definition["required"] = ["type", *definition.get("required", [])]
    return schema
