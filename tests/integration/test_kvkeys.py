"""`kv_keys` on a real nats-server: every key with an entry, and no consumer left behind
(nats-py's `KeyValue.keys()` leaves one per call; a router refreshing its fleet every
second ran the server out of consumers)."""

from __future__ import annotations

from nats.js.api import KeyValueConfig

from switchyard.bus.connection import Bus
from switchyard.bus.kvkeys import kv_keys


async def test_keys_are_listed_and_nothing_is_left_on_the_server(bus: Bus, unique: str) -> None:
    bucket = f"keys_{unique}"
    kv = await bus.js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
    try:
        assert await kv_keys(bus.js, bucket) == []
        for name in ("w-b", "w-a", "x.y"):
            await kv.put(name, b"1")
        await kv.put("w-a", b"2")  # a rewrite is still one key
        for _ in range(50):
            listed = await kv_keys(bus.js, bucket)
        assert listed == ["w-a", "w-b", "x.y"]
        assert await kv_keys(bus.js, bucket, "w-*") == ["w-a", "w-b"]
        await kv.delete("w-b")  # a delete marker: listed, and `get` says not found
        assert "w-b" in await kv_keys(bus.js, bucket)
        info = await bus.js.stream_info(f"KV_{bucket}")
        assert info.state.consumer_count == 0
    finally:
        await bus.js.delete_key_value(bucket)
