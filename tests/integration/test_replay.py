"""`sy replay`: a recorded 2-minute window of agent steps and Text2SQL questions, run on
the real `llamacpp` engine, is sent again into sandbox fleets on other NATS servers.

The first sandbox has the recording fleet's settings: every routing decision and every
temperature-0 output must come back identical, and the diff report says so. The second
has a smaller agent output budget: the report must show the outputs changed (and the
routing did not).

Slow by design (the window is the acceptance criterion's two minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from switchyard import subjects
from switchyard.agentactions import answer_token_budget
from switchyard.bench.phoneframes import draw_frame
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.streamread import Window, read
from switchyard.cli.app import app
from switchyard.config import Settings
from switchyard.fleet.readiness import PoolReady, wait_for_pools
from switchyard.forensics.replay import Collected
from switchyard.forensics.trace import find
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import GenerateResult
from switchyard.messages.sql import SqlAnswer, SqlAsk
from switchyard.natsserver import EmbeddedNats
from switchyard.partition import partition
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_heartbeat,
    worker_process,
)
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import sqlflow_in_process
from tests.support.sqlservices import sql_services

WINDOW = 120.0  # seconds of recording
STEP_EVERY = 7.5  # one agent step every 7.5 s: 16 steps
QUESTIONS = {  # seconds into the window -> question (verified, metric, generated)
    5.0: "What was DAU yesterday?",
    45.0: "Show DAU for each of the last 5 days",
    85.0: "Which 3 countries had the most new players in the last 7 days?",
}
AGENT, SQL = "ra", "rq"
PARTITIONS = 4


def sessions() -> list[str]:
    """One episode per partition, so the agent pool's two workers both get steps."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < PARTITIONS:
        name = f"episode-{n}"
        found.setdefault(partition(name, PARTITIONS), name)
        n += 1
    return [found[p] for p in sorted(found)]


@contextlib.asynccontextmanager
async def fleet(
    url: str, sqlenv: SqlEnv, index: Path, allow_thought: bool = True
) -> AsyncIterator[None]:
    """Everything both workloads need, with fixed worker ids (the routing is compared);
    yields once every partition of both pools is served."""
    # Workers as processes, as in production: three llama.cpp engines in the test's own
    # process would share one GIL, and a heartbeat starved by another engine's generation
    # looks like a death to the router, which then moves partitions mid-recording.
    env = {"SY_ENGINE": "llamacpp", "SY_ASSIGNMENT": "kv", "SY_HEARTBEAT_INTERVAL": "0.3",
           "SY_PARTITIONS": str(PARTITIONS), "SY_LLAMACPP_N_THREADS": "1"}  # fmt: skip
    agents = (f"{AGENT}-w0", f"{AGENT}-w1")
    pools = [PoolReady(AGENT, 2, PARTITIONS, worker_ids=agents),
             PoolReady(SQL, 1, PARTITIONS, worker_ids=(f"{SQL}-w0",))]  # fmt: skip
    bus = await connect(Settings(nats_url=url), "replay-setup")
    try:
        await provision_pool(bus.js, AGENT, PARTITIONS)
        await provision_pool(bus.js, SQL, PARTITIONS)
        with contextlib.ExitStack() as procs:
            children = [
                procs.enter_context(worker_process(url, SY_POOL=pool.pool, SY_WORKER_ID=wid, **env))
                for pool in pools
                for wid in pool.worker_ids
            ]

            def alive() -> None:
                for child in children:
                    child.check()

            # Every engine loaded before the router starts: it places both pools at once,
            # so no partition moves while the window is recorded.
            for pool in pools:
                for wid in pool.worker_ids:
                    await wait_for_heartbeat(bus.js, wid, timeout=120, check=alive)
            async with (
                sql_services(url, sqlenv, sql_explain_max_rows=50_000,
                             sql_explain_large_table_rows=20_000),
                router_in_process(url, partitions=PARTITIONS, pools=[AGENT, SQL],
                                  rebalance_interval=0.2, dead_after=20),
                preprocessor_in_process(url, agent_pool=AGENT,
                                        allow_thought=allow_thought, agent_max_tokens=256),
                sqlflow_in_process(url, sqlenv, index, sql_pool=SQL),
            ):  # fmt: skip
                await wait_for_pools(bus.js, pools, timeout=120, check=alive)
                yield
    finally:
        await bus.close()


def step(session: str, k: int) -> AgentStep:
    frame = draw_frame(sessions().index(session), k, (320, 180))
    return AgentStep(
        tenant="acme", session=session, step=k, frame_ts=time.time(), stale_after=300,
        frames=[RawFrame(data=frame, mime="image/jpeg")],
        goal="collect the daily reward", history=[f"step {i}" for i in range(k)],
        # The same max_tokens with or without a thought (what one with a thought needs), so
        # a changed `allow_thought` changes answers but not the load the router weighs.
        options=StepOptions(thought=True, max_tokens=answer_token_budget("json", 1, True)),
    )  # fmt: skip


async def record(bus: Bus) -> tuple[float, float, list[str], list[str]]:
    """Two minutes of traffic; returns the window and the ids of steps and questions."""
    results = Collected()
    sub = await bus.nc.subscribe("res.>", cb=results.on_result)
    names = sessions()
    plan: list[tuple[float, Callable[[], AgentStep | SqlAsk]]] = [
        (i * STEP_EVERY, functools.partial(step, names[i % len(names)], i // len(names)))
        for i in range(int(WINDOW / STEP_EVERY))
    ]
    plan += [(at, functools.partial(SqlAsk, tenant="acme", question=q))
             for at, q in QUESTIONS.items()]  # fmt: skip
    plan.sort(key=lambda x: x[0])
    since = time.time()
    steps, asks = [], []
    for at, make in plan:
        await asyncio.sleep(max(0.0, since + at - time.time()))
        message = make()  # made when due: its id, creation and frame times are a real send's
        if isinstance(message, AgentStep):
            await publish(bus.js, subjects.agent_in("acme"), message)
            steps.append(message.id)
        else:
            await publish(bus.js, subjects.sql_in("acme"), message)
            asks.append(message.id)
    until = since + WINDOW
    for rid in steps + asks:
        assert await results.wait_for(rid, 240), f"no result for {rid}"
    await sub.unsubscribe()
    await asyncio.sleep(max(0.0, until - time.time()))
    return since, until, steps, asks


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


async def replay(source: str, sandbox: str, since: float, until: float, out: Path,
                 *extra: str) -> tuple[int, dict[str, Any]]:  # fmt: skip
    args = ["replay", "--nats", source, "--to", sandbox, "--since", iso(since),
            "--until", iso(until), "--report", str(out), "--wait", "240", *extra]  # fmt: skip
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code in (0, 3), (result.output, result.exc_info)
    return result.exit_code, json.loads(out.read_text())


@pytest.mark.timeout(900)
async def test_a_recorded_window_replays_identically_and_shows_a_changed_setting(
    sqlenv: SqlEnv, tmp_path: Path
) -> None:
    with (
        EmbeddedNats(data_dir=tmp_path / "source") as source,
        EmbeddedNats(data_dir=tmp_path / "sandbox") as sandbox,
        EmbeddedNats(data_dir=tmp_path / "changed") as changed,
    ):
        bus = await connect(Settings(nats_url=source.url), "replay-test")
        try:
            async with fleet(source.url, sqlenv, tmp_path / "index-source"):
                since, until, steps, asks = await record(bus)
            # What was recorded is worth comparing: both agent workers ran steps, every
            # question was answered, and the generated one made model calls.
            recorded = Collected()
            async for stored in read(bus.js, "RES", Window()):
                recorded.add(stored.data)
            results = [recorded.outcomes[rid] for rid in steps]
            routed = {
                r.route.routed_to for r in results if isinstance(r, GenerateResult) and r.route
            }
            assert routed == {f"{AGENT}-w0", f"{AGENT}-w1"}, routed
            answers = [recorded.outcomes[a] for a in asks]
            assert all(isinstance(a, SqlAnswer) for a in answers)
            paths = [a.path for a in answers if isinstance(a, SqlAnswer)]
            assert paths[:2] == ["verified", "metric"], paths

            # `sy trace` of the generated question: its model calls and audit decisions.
            trace = await find(bus.js, asks[2], window=WINDOW + 300)
            names = [h.name for h in trace.ordered()]
            assert names[:2] == ["created", "stored"] and names[-1] == "answer stored"
            assert any(n.startswith("model call 1: dispatched") for n in names), names
            assert "audit sql.answer" in names, names
            assert sum(d for _, d in trace.steps()) == trace.end_to_end
        finally:
            await bus.close()

        async with fleet(sandbox.url, sqlenv, tmp_path / "index-sandbox"):
            code, same = await replay(source.url, sandbox.url, since, until,
                                      tmp_path / "same.json")  # fmt: skip
        total = len(steps) + len(asks)
        assert same["requests"] == total and same["answered"] == total, same
        shown = json.dumps(same["differences"], indent=1)[:4000]
        assert same["routing"] == {"compared": total, "same": total}, shown
        assert same["outputs"] == {"compared": total, "same": total}, shown
        assert code == 0 and same["identical"] and same["verdict"].startswith("reproduced")
        assert set(same["ids"]) == set(steps + asks)  # new ids remember the originals

        # Thoughts refused: the steps ask for one, so the model's answer takes another shape
        # (a bare action, not {"actions": [...]}). (max_tokens no longer changes answers: it
        # is derived from the action format, never below what an answer needs.)
        async with fleet(changed.url, sqlenv, tmp_path / "index-changed", allow_thought=False):
            only_steps = ("--subject", "agent.in.>")
            code, diff = await replay(source.url, changed.url, since, until,
                                      tmp_path / "changed.json", *only_steps)  # fmt: skip
        assert diff["requests"] == len(steps)
        assert code == 3 and not diff["identical"]
        assert diff["routing"]["same"] == len(steps)  # the same partitions and workers...
        assert diff["outputs"]["same"] < len(steps)  # ...but the model said something else
        assert any(d["what"] == "output" for d in diff["differences"])
