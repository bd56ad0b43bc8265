"""`sy status`: the live workers as their heartbeats say, role and GPU location included."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from switchyard.bus.connection import connect
from switchyard.config import Settings
from switchyard.ids import new_id
from tests.support.fleet import provision_pool, worker_in_process

SY = Path(sys.executable).with_name("sy")  # the venv's `sy`


async def sy_status(nats_url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(SY), "status", "--nats", nats_url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},  # a terminal as wide as the table
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_sy_status_lists_a_live_worker_with_its_role_and_location(nats_url: str) -> None:
    pool = f"st{new_id().lower()[-10:]}"
    async with await connect(Settings(nats_url=nats_url), "pytest-sy-status") as bus:
        await provision_pool(bus.js, pool)
    at = {"worker_role": "decode", "worker_topology": "gpu-server/1/3"}
    async with worker_in_process(nats_url, pool=pool, engine="sim", worker_id=f"{pool}-w0", **at):
        code, out, err = await sy_status(nats_url, "--json")
        assert code == 0, err
        (mine,) = [w for w in json.loads(out) if w["pool"] == pool]
        assert (mine["worker"], mine["role"], mine["topology"]) == (
            f"{pool}-w0",
            "decode",
            "gpu-server/1/3",
        )
        assert mine["slots"] >= 1 and 0 <= mine["age"] < 30 and mine["partitions"] == [0, 1, 2, 3]
        code, table, _ = await sy_status(nats_url)
        assert code == 0 and f"{pool}-w0" in table and "gpu-server/1/3" in table


async def test_sy_status_without_a_bus_says_so() -> None:
    code, out, err = await sy_status("nats://127.0.0.1:1")
    assert code == 1 and "cannot reach NATS" in out + err
