"""A disaggregated agent pool on real NATS (#39): a `prefill` and a `decode` sim worker.

The router sends a step to the prefill worker (its session's, for the prefix cache),
which computes the prompt's KV and one token and hands the decode stage back on REQ; the
router places that on the decode worker (sticky per session too), which moves the KV
(modelled: the bytes over the link) instead of computing it, and answers. The phone sees
one answer per step, from the decode worker. A colocated worker beside them is the
control: the same step prefilled there costs the frame's compute.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

from prometheus_client import REGISTRY

from switchyard.bench.agentsim import AgentSimConfig, play, summarise
from switchyard.bus.connection import connect
from switchyard.capacity.calibration import sim_decode_seconds
from switchyard.config import Settings
from switchyard.engines.sim import SimSettings
from switchyard.ids import new_id
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)

CFG = AgentSimConfig(
    engine="sim", workers=2, width=1280, height=720, stale_after=30.0, frame_pool=2,
    delay_scale=1.0, action_format="compact", act_ms=50,
)  # fmt: skip


def handoffs() -> float:
    return REGISTRY.get_sample_value("sy_worker_handoff_requests_total") or 0.0


@contextlib.asynccontextmanager
async def agent_pool(nats_url: str, roles: tuple[str, ...]) -> AsyncIterator[str]:
    """Router, preprocessor and one sim worker per role for a private pool; its name."""
    pool = f"pd{new_id().lower()[-10:]}"
    bus = await connect(Settings(nats_url=nats_url), "pytest-pd")
    await provision_pool(bus.js, pool)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2)
            )
            for i, role in enumerate(roles):
                await stack.enter_async_context(
                    worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                                      worker_id=f"{pool}-w{i}", worker_role=role)
                )  # fmt: skip
            await stack.enter_async_context(
                preprocessor_in_process(nats_url, agent_pool=pool, frame_procs=0)
            )
            await wait_for_pool(bus.js, pool, len(roles))
            yield pool
    finally:
        await bus.close()


def moved_prompt_bound() -> float:
    """The most a decode stage's modelled "prefill" (its arrival's step boundary -> first
    token) can take on the sim's default card when nothing is computed: the step it waits
    for, the step that samples its first token, and 20,000 tokens of KV over the link (more
    than a step's prompt here). A colocated 1280x720 step prefills for far longer: ~95 ms
    of encoder and ~80 ms of LLM prefill (capacity/calibration.py's table)."""
    s = SimSettings()
    return 2 * sim_decode_seconds(s, 2) + 20_000 * s.kv_bytes_per_token / (s.kv_link_gbs * 1e9)


async def test_a_step_runs_its_prefill_and_decode_on_two_workers(nats_url: str) -> None:
    before = handoffs()
    async with agent_pool(nats_url, ("prefill", "decode")) as pool:
        cfg = replace(CFG, nats_url=nats_url, tenant=f"pd{new_id().lower()[-8:]}",
                      phones=2, steps=3)  # fmt: skip
        played = await play(cfg, nats_url)
    recs = played.records
    assert [r.status for r in recs] == ["ok"] * 6, [(r.status, r.code) for r in recs]
    assert all(r.valid and r.executed for r in recs)
    # Every answer came from the decode worker, each step prefilled once on the prefill one.
    assert {r.worker for r in recs} == {f"{pool}-w1"}
    assert handoffs() - before == 6
    # The decode worker computed no prompt: its modelled "prefill" is the KV's move over
    # the link and one token's step, far under a prefill of the step's prompt.
    for r in recs:
        assert r.prefill_s is not None and r.prefill_s < moved_prompt_bound(), r.prefill_s
    report = summarise(cfg, recs, played.wall_s, played.times)
    assert report.errors == {} and report.superseded == 0


async def test_a_colocated_worker_computes_the_prompt_itself(nats_url: str) -> None:
    """The control for the bound above: the same steps on a `both` worker."""
    before = handoffs()
    async with agent_pool(nats_url, ("both",)) as pool:
        cfg = replace(CFG, nats_url=nats_url, tenant=f"pd{new_id().lower()[-8:]}",
                      phones=1, steps=2, workers=1)  # fmt: skip
        played = await play(cfg, nats_url)
    (first, _) = sorted(played.records, key=lambda r: r.step)
    assert first.status == "ok" and first.worker == f"{pool}-w0"
    assert first.prefill_s is not None and first.prefill_s > 3 * moved_prompt_bound()
    assert handoffs() == before
