"""OpenAI chat-completions shapes: the request we accept and what we answer.

Both OpenAI surfaces of the project speak them: the edge (`services/edge`, in front of
the fleet) and `sy sim-server` (one simulated vLLM engine), so the two validate and
answer the same way. They live in the core library, beside the code they convert to
(`messages.inference`), and not in `messages/`: those are the fleet's bus contracts,
published in `proto/`, while these are an HTTP wire format the fleet never carries.

Unknown request fields are ignored (as OpenAI's SDKs send optional extras), but every
field we act on is validated and capped here, so a bad request is a 422 with the
offending field named before anything reaches the bus. That includes the session key a
client names (`X-Session-ID`, else `user`; `requested_session`), which the edge turns
into the fleet's per-tenant session id (`tenant_session`).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from switchyard.messages.inference import (
    ChatMessage,
    Constraint,
    GenerateResult,
    ImagePart,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    NoConstraint,
    Sampling,
    TextPart,
)


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_In):
    type: Literal["text"]
    text: Annotated[str, Field(max_length=256 * 1024)]


class InMessage(_In):
    # `developer` is OpenAI's newer name for `system`. Tool and function roles are
    # refused by the schema: the fleet has no tool calling yet.
    role: Literal["system", "developer", "user", "assistant"]
    content: (
        Annotated[str, Field(max_length=256 * 1024)]
        | Annotated[list[ContentPart], Field(min_length=1, max_length=64)]
    )
    name: Annotated[str, Field(max_length=64)] | None = None


class StreamOptions(_In):
    include_usage: bool = False


class JsonSchemaSpec(_In):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    # Named `schema` on the wire; `schema_` avoids shadowing BaseModel.schema.
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: Annotated[str, Field(max_length=4096)] | None = None


class TextFormat(_In):
    type: Literal["text"]


class JsonObjectFormat(_In):
    type: Literal["json_object"]


class JsonSchemaFormat(_In):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


# Discriminated by `type`, so the OpenAPI schema says `json_schema` is required with it.
ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


# --- sessions ---------------------------------------------------------------------------

SESSION_HEADER = "X-Session-ID"
SESSION_KEY_MAX = 256
# Printable ASCII without spaces: ids, UUIDs, e-mail addresses and hashes (what OpenAI asks
# `user` to be) all fit; control characters, whitespace and non-ASCII do not, so two keys
# that print alike (a trailing space, a Cyrillic "a") are never two sessions by surprise.
SESSION_KEY = re.compile(rf"[\x21-\x7e]{{1,{SESSION_KEY_MAX}}}")
SESSION_KEY_RULE = f"1-{SESSION_KEY_MAX} printable ASCII characters without spaces"
USER_DOC = f"The session key ({SESSION_KEY_RULE}), unless an {SESSION_HEADER} header wins."
HEADER_DOC = f"The session key ({SESSION_KEY_RULE}); wins over the body's `user`."


class InvalidSession(ValueError):
    """A session key the request names that is not one; `param` is where it came from."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def requested_session(headers: list[str], user: str | None) -> str | None:
    """The session key a request names: its `X-Session-ID` header (every value it came
    with), else its `user` field, else none. The one that is used must be valid whole;
    a bad key is refused (`InvalidSession`), never cut or cleaned into another one, and
    the value itself is not echoed (it may be an e-mail address, or 1 MB of noise)."""
    if len(headers) > 1:
        # Two values (a proxy appending its own?) name no one session: refuse to guess.
        raise InvalidSession(SESSION_HEADER, f"{SESSION_HEADER} is given {len(headers)} times")
    param, key = (SESSION_HEADER, headers[0]) if headers else ("user", user)
    if key is None:
        return None
    if SESSION_KEY.fullmatch(key) is None:
        if not key:
            why = "is empty"
        elif len(key) > SESSION_KEY_MAX:
            why = f"has {len(key)} characters"
        else:
            at = next(i for i, c in enumerate(key) if not "\x21" <= c <= "\x7e")
            why = f"has {key[at]!r} at position {at}"
        raise InvalidSession(param, f"{param} {why}; a session key is {SESSION_KEY_RULE}")
    return key


def tenant_session(tenant: str, key: str) -> str:
    """The fleet's session id for a tenant's session key: 32 hex digits of a hash of both.

    The envelope's `SessionId` is a NATS token (at most 64 of `[A-Za-z0-9_-]`) and a key
    may be 256 printable characters, so the id is a digest: fixed length, injective in
    practice (128 bits; NUL is in neither a tenant id nor a key). The router keeps
    sessions per tenant anyway (`services/router/sessions.py::route_id`); hashing the
    tenant in as well means no two tenants' ids are ever equal, in logs or anywhere."""
    return hashlib.blake2b(f"{tenant}\0{key}".encode(), digest_size=16).hexdigest()


class ChatCompletionRequest(_In):
    model: Annotated[str, Field(min_length=1, max_length=256)]
    messages: Annotated[list[InMessage], Field(min_length=1, max_length=256)]
    max_tokens: Annotated[int, Field(ge=1, le=32768)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=32768)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # 2**53 - 1, not 2**63 - 1: OpenAPI/JSON numbers are doubles, and 2**63 - 1 rounds up to
    # 2**63 in the schema, so a schema-valid seed would fail validation.
    seed: Annotated[int, Field(ge=0, le=2**53 - 1)] | None = None
    stop: (
        Annotated[str, Field(max_length=256)]
        | Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=8)]
        | None
    ) = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # No pattern here: the sim server takes any `user`; the edge checks the one it uses.
    user: Annotated[str, Field(max_length=SESSION_KEY_MAX, description=USER_DOC)] | None = None

    def chat_messages(self, max_chars: int) -> list[ChatMessage]:
        out = []
        for i, m in enumerate(self.messages):
            text = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
            if len(text) > max_chars:
                raise ValueError(f"messages[{i}] has {len(text)} characters (cap {max_chars})")
            role = "system" if m.role == "developer" else m.role
            content: str | list[TextPart | ImagePart] = (
                m.content if isinstance(m.content, str) else [TextPart(text=text)]
            )
            out.append(ChatMessage(role=role, content=content))
        return out

    def sampling(self, default_max: int, cap: int) -> Sampling:
        max_tokens = self.max_completion_tokens or self.max_tokens or default_max
        if max_tokens > cap:
            raise ValueError(f"max_tokens {max_tokens} is over this edge's cap of {cap}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return Sampling(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=stop,
        )

    def constraint(self) -> Constraint:
        rf = self.response_format
        if rf is None or isinstance(rf, TextFormat):
            return NoConstraint()
        if isinstance(rf, JsonObjectFormat):
            return JsonObjectConstraint()
        return JsonSchemaConstraint(json_schema=rf.json_schema.schema_)


# --- responses ---------------------------------------------------------------------------

FinishReason = Literal["stop", "length"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompletionUsage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class Choice(_Out):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None


class Delta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Out):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(_Out):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class ModelCard(_Out):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "switchyard"


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def completion_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def usage_of(result: GenerateResult) -> CompletionUsage:
    u = result.usage
    return CompletionUsage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.prompt_tokens + u.completion_tokens,
    )


def finish_reason(result: GenerateResult) -> FinishReason:
    return "length" if result.finish_reason == "length" else "stop"


def completion(request_id: str, model: str, result: GenerateResult) -> ChatCompletion:
    return ChatCompletion(
        id=completion_id(request_id),
        created=int(result.created_at or time.time()),
        model=model,
        choices=[
            Choice(
                message=AssistantMessage(content=result.text), finish_reason=finish_reason(result)
            )
        ],
        usage=usage_of(result),
    )
