"""The latest value of every key of a KV bucket, read as a list (the edge's console, `sy
status`).

The server lists the matching keys (stream info with a subject filter), then each key's
last message is fetched. Not `KeyValue.watch`: nats-py can hand out its "no more values"
marker before a value that is already on its way, which would show a live fleet as empty.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from pydantic import BaseModel

from switchyard.codec import decode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger

log = get_logger(__name__)
M = TypeVar("M", bound=BaseModel)


class KvUnreadable(Exception):
    """The bucket could not be read (in time): half a list would read as the whole."""


async def latest_values(
    js: JetStreamContext, bucket: str, keys: str, model: type[M], timeout: float
) -> list[M]:
    """The latest value of every key matching `keys` (a subject filter, applied by the
    server), in key order; an undecodable value is logged and skipped, a missing bucket
    is no rows, deleted and purged keys are none. `KvUnreadable` when the server does
    not answer within `timeout` seconds or a read fails."""
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    try:
        async with asyncio.timeout(timeout):
            try:
                info = await js.stream_info(stream, subjects_filter=prefix + keys)
            except nats.js.errors.NotFoundError:
                log.warning("kv.no_bucket", bucket=bucket)
                return []
            found = sorted((info.state.subjects or {}).keys())
            stored = await asyncio.gather(
                *(js.get_last_msg(stream, subject) for subject in found),
                return_exceptions=True,
            )
    except (TimeoutError, nats.errors.TimeoutError):
        raise KvUnreadable(f"fleet state ({bucket}) could not be read in time") from None
    out: list[M] = []
    for subject, msg in zip(found, stored, strict=True):
        if isinstance(msg, nats.js.errors.NotFoundError):
            continue  # expired or purged between the listing and the read
        if isinstance(msg, BaseException):
            raise KvUnreadable(f"fleet state ({bucket}) could not be read") from msg
        if not msg.data or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            continue
        try:
            out.append(decode(msg.data, model))
        except DecodeError as exc:
            log.warning("kv.bad_value", bucket=bucket, key=subject[len(prefix):],
                        error=exc.reason[:200])  # fmt: skip
    return out
