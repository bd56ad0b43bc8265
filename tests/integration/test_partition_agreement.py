"""`partition(key, P)` agrees with a real nats-server's `{{partition(P,...)}}` mappings:
a synthetic one for several P, and the production one read from compose/nats-auth.conf."""

from __future__ import annotations

import asyncio
import random
import re
import string
from pathlib import Path

import nats
import pytest

from switchyard.config import Settings
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


COMPOSE_AUTH = Path(__file__).resolve().parents[2] / "compose" / "nats-auth.conf"


def compose_mappings() -> str:
    """The `mappings { ... }` block of the production config, verbatim."""
    text = COMPOSE_AUTH.read_text()
    start = text.index("mappings {")
    return text[start : text.index("\n}\n", start) + 2]  # its closing brace, in column 0


async def test_production_mapping_matches_the_router(tmp_path: Path) -> None:
    """compose's `route.<pool>.<key>` mapping names the partition the router gives `key`."""
    block = compose_mappings()
    found = re.search(r"\{\{partition\((\d+),2\)\}\}", block)
    assert found is not None, block
    partitions = int(found.group(1))
    assert partitions == Settings().partitions  # SY_PARTITIONS' default
    keys = _keys(600, seed=11)
    with EmbeddedNats(data_dir=tmp_path, extra_config=block) as server:
        nc = await nats.connect(server.url)
        landed: dict[tuple[str, str], int] = {}
        done = asyncio.Event()
        sent: set[tuple[str, str]] = set()

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            _, pool, p, key = msg.subject.split(".", 3)
            landed[(pool, key)] = int(p)
            if len(landed) == len(sent):
                done.set()

        await nc.subscribe("routed.*.*.*", cb=on_msg)
        for i, key in enumerate(keys):
            if "." in key:
                continue
            pool = ("agent", "sql")[i % 2]  # agent: session id; sql: tenant
            sent.add((pool, key))
            await nc.publish(f"route.{pool}.{key}", b"")
        await nc.flush()
        await asyncio.wait_for(done.wait(), 20)
        await nc.close()
    assert set(landed) == sent and len(sent) >= 500
    wrong = {k: v for k, v in landed.items() if v != partition(k[1], partitions)}
    assert wrong == {}
