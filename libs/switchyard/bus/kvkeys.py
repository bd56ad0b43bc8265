"""The keys of a KV bucket, listed without leaving anything behind on the server.

nats-py's `KeyValue.keys()` lists through an ordered consumer (a watch) on the
bucket's stream, one per call, and never deletes it: a router refreshing its fleet
every second piled up consumers until the server refused new ones ("maximum consumers
limit reached") after about a quarter of an hour. The stream's own subject index
(`STREAM.INFO` with a subjects filter) names every key that has a stored entry, and
creates nothing.
"""

from __future__ import annotations

from nats.js import JetStreamContext


async def kv_keys(js: JetStreamContext, bucket: str, pattern: str = ">") -> list[str]:
    """Keys of `bucket` matching `pattern` (a NATS subject pattern) with a stored entry:
    a value, or a delete marker (which `KeyValue.get` then reports as not found)."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=prefix + pattern)
    return sorted(s.removeprefix(prefix) for s in (info.state.subjects or {}))
