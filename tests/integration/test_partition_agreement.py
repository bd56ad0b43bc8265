"""`partition(key, P)` agrees with a real nats-server's `{{partition(P,1)}}` mapping."""

from __future__ import annotations

import asyncio
import random
import string
from pathlib import Path

import nats
import pytest

from switchyard.natsserver import EmbeddedNats
from switchyard.partition import partition

ALPHABET = string.ascii_letters + string.digits + "-_"


def _keys(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    keys = {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40))) for _ in range(n)}
    keys |= {"episode-ü-1", "租户-7", "x"}  # multi-byte UTF-8 tokens hash as bytes
    return sorted(keys)


@pytest.mark.parametrize("partitions", [64, 7])
async def test_partition_matches_server_mapping(tmp_path: Path, partitions: int) -> None:
    mapping = (
        f'mappings: {{ "pt.*": "ptout.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}" }}'
    )
    keys = _keys(1200, seed=partitions)
    with EmbeddedNats(data_dir=tmp_path, extra_config=mapping) as server:
        nc = await nats.connect(server.url)
        landed: dict[str, int] = {}
        done = asyncio.Event()

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            _, p, key = msg.subject.split(".", 2)
            landed[key] = int(p)
            if len(landed) == len(keys):
                done.set()

        await nc.subscribe("ptout.*.*", cb=on_msg)
        for key in keys:
            await nc.publish(f"pt.{key}", b"")
        await nc.flush()
        await asyncio.wait_for(done.wait(), 20)
        await nc.close()
    assert len(landed) >= 1000
    mismatched = {
        k: (v, partition(k, partitions)) for k, v in landed.items() if v != partition(k, partitions)
    }
    assert mismatched == {}
