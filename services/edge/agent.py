"""`POST /v1/agent/step`: the HTTP shape of an agent step, how it is read, and its answer.

A step arrives as JSON (frames base64-encoded) or as `multipart/form-data`
(frames as file parts named `frames`, the other fields as form fields:
`history` and `pending` may repeat, `options` is a JSON object). Both become one
`AgentStepBody`; the edge adds the tenant (from the key, never the body), the
id, the deadline and the reply inbox, and publishes an `AgentStep` on
`agent.in.<tenant>`. The preprocessor's refusals come back typed and become
HTTP statuses here (see `AGENT_STATUS`).
"""

from __future__ import annotations

import base64
import binascii
import json
from email.parser import BytesParser
from email.policy import HTTP
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from services.edge.errors import ApiError
from switchyard.envelope import SessionId
from switchyard.messages.agent import MAX_FRAMES, Action, StepFields, StepOptions
from switchyard.messages.inference import GenerateResult, Usage

# Agent-specific statuses, over the shared table in `errors.py`:
# - `stale` -> 409: the frame is older than its budget when the fleet got to it; the
#   request was well-formed, but acting on that screen would conflict with the game's
#   current state. The client should capture a fresh frame (not retry the same one).
# - a frame the preprocessor refuses as not-an-image/corrupt -> 422 with its typed code
#   (`invalid_request`, `truncated`, `schema`); `oversized` (bytes, pixels, decompression
#   bomb) stays 413. over_quota 429 + Retry-After, expired (deadline) 504 as everywhere.
AGENT_STATUS: dict[str, int] = {
    "stale": 409,
    "invalid_request": 422,
    "truncated": 422,
    "schema": 422,
    "malformed": 422,
}


class FrameIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: str = Field(min_length=1, description="the frame's bytes, base64 (PNG/JPEG/WebP)")
    mime: Annotated[str, StringConstraints(max_length=100)] = "application/octet-stream"


class StepIn(StepFields):
    """A step's fields as both encodings take them: the bus's (`StepFields`, its caps), and
    an HTTP step names its episode. There is no `tenant` field: the tenant is the API key's."""

    session: SessionId = Field(description="episode id (session affinity, KV reuse)")


class AgentStepBody(StepIn):
    """A JSON step: its fields and its frames, base64."""

    frames: Annotated[list[FrameIn], Field(min_length=1, max_length=MAX_FRAMES)] = Field(
        description="one frame (current) or two (previous, current)"
    )


class StepTimings(BaseModel):
    """Seconds. `queue`/`ttft`/`total` are the worker's; `edge` is the whole HTTP request."""

    edge: float
    queue: float
    ttft: float | None = None
    total: float
    frame_age: float = Field(description="now - frame_ts when the answer left the edge")


class AgentStepResponse(BaseModel):
    request_id: str
    status: Literal["ok"]
    session: str
    step: int
    frame_ts: float
    answer: Any = Field(
        description="the answer exactly as constrained: the action JSON (answer_schema), or "
        "for action_format `compact` or `grid` its text, one action a line (`grid`'s points "
        "stay on its 0-999 grid; `actions` are in the phone's pixels)"
    )
    actions: list[Action]
    thought: str | None = None
    worker: str | None = None
    usage: Usage
    timings: StepTimings


class StepInput(BaseModel):
    """A step read from either encoding: the fields and the decoded frames."""

    fields: StepIn
    frames: list[tuple[bytes, str]]


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(422, message, code="invalid_request", param=param)


def _from_validation(exc: ValidationError) -> ApiError:
    errors = exc.errors()
    if not errors:
        return _invalid("invalid step")
    where = ".".join(str(p) for p in errors[0]["loc"])
    return _invalid(f"{where}: {errors[0]['msg']}", where or None)


def check_frames(frames: list[tuple[bytes, str]], max_frame_bytes: int) -> None:
    if not 1 <= len(frames) <= MAX_FRAMES:
        raise _invalid(f"a step has 1 or {MAX_FRAMES} frames, got {len(frames)}", "frames")
    for i, (data, _) in enumerate(frames):
        if not data:
            raise _invalid(f"frame {i} is empty", "frames")
        if len(data) > max_frame_bytes:
            raise ApiError(
                413,
                f"frame {i} is {len(data)} bytes, over the {max_frame_bytes}-byte cap per frame",
                code="oversized",
                param="frames",
            )


def parse_json(raw: bytes) -> StepInput:
    try:
        body = AgentStepBody.model_validate_json(raw)
    except ValidationError as exc:
        raise _from_validation(exc) from None
    frames = []
    for i, frame in enumerate(body.frames):
        try:
            frames.append((base64.b64decode(frame.data, validate=True), frame.mime))
        except (binascii.Error, ValueError):
            raise _invalid(f"frames.{i}.data is not valid base64", f"frames.{i}.data") from None
    # Validated with the body: its fields as they are, not validated again.
    fields = StepIn.model_construct(**{n: getattr(body, n) for n in StepIn.model_fields})
    return StepInput(fields=fields, frames=frames)


def parse_multipart(content_type: str, raw: bytes) -> StepInput:
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=HTTP).parsebytes(head + raw)
    if not message.is_multipart():
        raise _invalid("multipart body without parts or boundary")
    values: dict[str, Any] = {}
    lists: dict[str, list[str]] = {"history": [], "pending": []}  # repeated fields
    frames: list[tuple[bytes, str]] = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if name == "frames":
            frames.append((data, part.get_content_type()))
            continue
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise _invalid(f"form field {name!r} is not UTF-8", str(name)) from None
        if isinstance(name, str) and name in lists:
            lists[name].append(text)
        elif name == "options":
            try:
                values["options"] = json.loads(text)
            except ValueError:
                raise _invalid("options must be a JSON object", "options") from None
        elif isinstance(name, str):
            values[name] = text
    values.update({name: texts for name, texts in lists.items() if texts})
    for number in ("frame_ts", "sent_at", "stale_after"):
        if number in values:
            values[number] = _number(values[number], number, float)
    if "step" in values:
        values["step"] = _number(values["step"], "step", int)
    try:
        fields = StepIn.model_validate(values)
    except ValidationError as exc:
        raise _from_validation(exc) from None
    return StepInput(fields=fields, frames=frames)


def _number(text: str, name: str, kind: type[float] | type[int]) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise _invalid(f"{name} must be a number", name) from None


def response_of(
    result: GenerateResult, fields: StepIn, edge_seconds: float, now: float
) -> AgentStepResponse:
    """The HTTP answer of `result`, as its worker's output step typed it (no parsing here)."""
    fmt = fields.options.action_format
    if result.actions is None:
        # The worker refuses an answer that is cut or not one (`answer_cut`); an ok result
        # without its actions (an older worker's) is refused the same way here.
        raise ApiError(
            502, f"the model's answer is not a valid {fmt} answer", "server_error", "answer_cut"
        )
    return AgentStepResponse(
        request_id=result.request_id, status="ok", session=fields.session, step=fields.step,
        frame_ts=fields.frame_ts,
        # JSON: the object as the model wrote it; compact, grid: its lines, as one string.
        answer=json.loads(result.text) if fmt == "json" else result.text,
        actions=result.actions, thought=result.thought, worker=result.worker,
        usage=result.usage,
        timings=StepTimings(
            edge=edge_seconds, queue=result.timings.queue, ttft=result.timings.ttft,
            total=result.timings.total, frame_age=max(0.0, now - fields.frame_ts),
        ),
    )  # fmt: skip


def openapi_request_body() -> dict[str, Any]:
    """Both encodings, for the generated schema (the body is read by hand, see `parse_*`),
    each derived from `StepIn`."""
    fields = StepIn.model_json_schema()
    fields.pop("$defs", None)
    frame = FrameIn.model_json_schema()
    frame["properties"]["data"]["contentEncoding"] = "base64"
    properties = fields["properties"]
    frames = {"type": "array", "minItems": 1, "maxItems": MAX_FRAMES}
    json_schema = {
        **fields,
        "title": "AgentStepBody",
        "properties": {
            **properties,
            "options": StepOptions.model_json_schema(),  # inlined, no $ref
            "frames": {**frames, "items": frame},
        },
        "required": [*fields.get("required", []), "frames"],
        "additionalProperties": False,
    }
    # A form field is text, never null (an optional field's schema is its first, non-null
    # one), and `options` is its JSON object as one field.
    form_fields = {n: s["anyOf"][0] if "anyOf" in s else s for n, s in properties.items()}
    form_fields["options"] = {
        "type": "string",
        "description": f"JSON object: {', '.join(StepOptions.model_fields)}",
    }
    form = {
        "type": "object",
        "properties": {
            "frames": {**frames, "items": {"type": "string", "format": "binary"}},
            **form_fields,
        },
        "required": ["frames", *fields.get("required", [])],
    }
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": json_schema},
                "multipart/form-data": {"schema": form},
            },
        },
    }
