"""msgpack codec for every message model, with typed decode errors.

Decoding never raises anything but `DecodeError`: a malformed, truncated,
oversized, wrong-version or off-schema payload says which, and why.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, ValidationError

from switchyard.envelope import ENVELOPE_VERSION, Envelope
from switchyard.errors import DecodeError
from switchyard.messages.agent import AgentStep
from switchyard.messages.inference import (
    Cancel,
    ChatRequest,
    GenerateRequest,
    GenerateResult,
)
from switchyard.messages.sql import (
    AuditEvent,
    ExecuteReply,
    ExecuteRequest,
    SqlAnswer,
    SqlAsk,
    StageEvent,
    StageProgress,
    ValidateReply,
    ValidateRequest,
)

M = TypeVar("M", bound=BaseModel)

DEFAULT_MAX_BYTES = 8 * 1024 * 1024

ENVELOPES: dict[str, type[Envelope]] = {
    model.model_fields["kind"].default: model
    for model in (
        AgentStep,
        ChatRequest,
        GenerateRequest,
        GenerateResult,
        Cancel,
        SqlAnswer,
        SqlAsk,
        ValidateRequest,
        ValidateReply,
        ExecuteRequest,
        ExecuteReply,
        StageEvent,
        StageProgress,
        AuditEvent,
    )
}


def encode(message: BaseModel) -> bytes:
    packed: bytes = msgpack.packb(message.model_dump(mode="python"), use_bin_type=True)
    return packed


def _unpack(data: bytes, max_bytes: int) -> Any:
    if len(data) > max_bytes:
        raise DecodeError(f"payload of {len(data)} bytes exceeds {max_bytes}", code="oversized")
    if not data:
        raise DecodeError("empty payload", code="truncated")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=1_000_000,
            max_map_len=100_000,
        )
    except msgpack.ExtraData as exc:
        raise DecodeError(f"trailing bytes after message: {exc}", code="malformed") from exc
    except ValueError as exc:
        if "incomplete" in str(exc).lower():
            raise DecodeError("payload ends before the message does", code="truncated") from exc
        raise DecodeError(f"not msgpack: {exc}", code="malformed") from exc
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise DecodeError(f"not msgpack: {type(exc).__name__}: {exc}", code="malformed") from exc


def _check_version(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise DecodeError(f"expected a map, got {type(obj).__name__}", code="schema")
    version = obj.get("v", ENVELOPE_VERSION)
    if version != ENVELOPE_VERSION:
        raise DecodeError(
            f"envelope version {version!r} is not supported (this build speaks {ENVELOPE_VERSION})",
            code="version",
        )


def _validate(model: type[M], obj: Any) -> M:
    try:
        return model.model_validate(obj, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        too_big = any(
            e["type"] in {"string_too_long", "too_long", "bytes_too_long"} for e in exc.errors()
        )
        raise DecodeError(
            f"{model.__name__}: {where}: {first['msg']} ({exc.error_count()} error(s))",
            code="oversized" if too_big else "schema",
        ) from exc


def decode(data: bytes, model: type[M], *, max_bytes: int = DEFAULT_MAX_BYTES) -> M:
    """Decode `data` as `model`, or raise `DecodeError` with the reason."""
    obj = _unpack(data, max_bytes)
    _check_version(obj)
    return _validate(model, obj)


def decode_envelope(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Envelope:
    """Decode any envelope, choosing the model by its `kind`."""
    obj = _unpack(data, max_bytes)
    _check_version(obj)
    kind = obj.get("kind")
    model = ENVELOPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise DecodeError(f"unknown message kind {kind!r}", code="schema")
    return _validate(model, obj)


def envelope_or_none(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Envelope | None:
    """`decode_envelope`, or None for bytes that are not one of our envelopes: for readers
    of a stream that skip what they are not looking for."""
    try:
        return decode_envelope(data, max_bytes=max_bytes)
    except DecodeError:
        return None
