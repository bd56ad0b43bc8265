"""vLLM's EngineCore killed under load: every request answered exactly once, none hangs.

A router (in process) and two `--engine vllm` worker processes share a private pool; 16
chat requests (half streamed, half not) are in flight when the EngineCore child of one
worker is SIGKILLed. vLLM then fails every request of that engine (`EngineDeadError`,
`AsyncLLM.errored`); the worker answers those that had streamed tokens with
`engine_error`, hands the others back, beats `draining` so the router moves its
partitions, and exits with status 3. The other worker answers what was handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter, defaultdict
from typing import Any

import psutil
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from services.worker.service import ENGINE_DEAD_EXIT
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.topology import SESSIONS_BUCKET
from switchyard.codec import decode
from switchyard.messages.fleet import SessionRoute, session_key
from switchyard.messages.inference import (
    ChatMessage,
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenFrame,
)
from tests.support.fleet import (
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_process,
)
from tests.support.poll import until

REQUESTS = 16
MAX_TOKENS = 64
PROMPT = "Count from one to one hundred in words, separated by commas."


def _running(procs: list[psutil.Process]) -> list[int]:
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
    return alive


async def worker_of(bus: Bus, req: GenerateRequest) -> str | None:
    """The worker the router sent `req`'s session to (KV `fleet_sessions`)."""
    assert req.session is not None
    kv = await bus.js.key_value(SESSIONS_BUCKET)
    try:
        entry = await kv.get(session_key(req.pool, req.tenant, req.session))
    except KeyNotFoundError:
        return None
    return decode(entry.value, SessionRoute).worker if entry.value else None


def engine_cores(pid: int) -> list[psutil.Process]:
    """The vLLM EngineCore processes under the worker process `pid`."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                found.append(child)
    return found


async def test_engine_core_killed_under_load_answers_everything_once(
    bus: Bus, unique: str, nats_url: str, vllm_worker_env: dict[str, str]
) -> None:
    began = time.monotonic()
    pool, tenant = f"v{unique}", f"t{unique}"
    await provision_pool(bus.js, pool, partitions=4)
    a, b = f"{pool}-w0", f"{pool}-w1"  # the names wait_for_pool expects
    env = {
        **vllm_worker_env, "SY_POOL": pool, "SY_ASSIGNMENT": "kv", "SY_PARTITIONS": "4",
        "SY_HEARTBEAT_INTERVAL": "0.5",
    }  # fmt: skip
    frames: dict[str, list[TokenFrame]] = defaultdict(list)
    results: Counter[str] = Counter()
    arrived: dict[str, float] = {}  # request id -> when its (first) final frame came

    async def on_res(msg: Msg) -> None:
        results[decode(msg.data, GenerateResult).request_id] += 1

    def finals(rid: str) -> list[TokenFrame]:
        return [f for f in frames[rid] if f.type != "delta"]

    def streamed(rid: str) -> bool:
        return any(f.type == "delta" for f in frames[rid])

    res_sub = await bus.js.subscribe(f"res.llm.{tenant}", cb=on_res, ordered_consumer=True)
    # Every rebalance lists KV keys, which leaves an ephemeral consumer behind (nats-py
    # 2.16): at 0.2 s the bucket hits the server's consumer limit in about 3 minutes.
    async with router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.5):
        with (
            worker_process(nats_url, SY_WORKER_ID=a, **env) as proc_a,
            worker_process(nats_url, SY_WORKER_ID=b, **env) as proc_b,
        ):
            tree: list[psutil.Process] = []
            try:

                def alive() -> None:
                    proc_a.check()
                    proc_b.check()

                # Two engines start side by side on 2 cores: ~1 min, minutes under load.
                await wait_for_pool(bus.js, pool, workers=2, partitions=4, timeout=420,
                                    check=alive)  # fmt: skip
                started = time.monotonic()
                reqs = []
                for i in range(REQUESTS):
                    req = GenerateRequest(
                        tenant=tenant, workload="llm", pool=pool, stream=i % 2 == 0,
                        session=f"s{i}",
                        messages=[ChatMessage(role="user", content=f"{PROMPT} ({i})")],
                        sampling=Sampling(max_tokens=MAX_TOKENS, temperature=0.0, seed=i),
                    )  # fmt: skip
                    inbox = bus.nc.new_inbox()

                    async def on_frame(msg: Msg, rid: str = req.id) -> None:
                        frame = decode(msg.data, TokenFrame)
                        frames[rid].append(frame)
                        if frame.type != "delta":
                            arrived[rid] = time.monotonic()

                    await bus.nc.subscribe(inbox, cb=on_frame)
                    reqs.append(req)
                    sent = req.model_copy(update={"reply": inbox})
                    await publish(bus.js, subjects.req("llm", tenant), sent)

                async def a_mid_flight() -> bool:
                    """A holds a streamed request that has sent tokens and a request
                    that is not streamed, both unanswered (the router's session routes
                    say which worker each went to)."""
                    on_a = [r for r in reqs
                            if not finals(r.id) and await worker_of(bus, r) == a]  # fmt: skip
                    return any(r.stream and streamed(r.id) for r in on_a) and any(
                        not r.stream for r in on_a
                    )

                await until(a_mid_flight, timeout=120, every=0.1,
                            what=f"{a} streaming one request and running another")  # fmt: skip
                tree = psutil.Process(proc_a.pid).children(recursive=True)
                cores = engine_cores(proc_a.pid)
                assert len(cores) == 1, [(p.pid, p.name()) for p in tree]
                cores[0].send_signal(signal.SIGKILL)
                killed = time.monotonic()
                answered_before = {rid for rid in frames if finals(rid)}

                # The worker exits 3, by itself, promptly.
                await until(lambda: not proc_a.alive(), timeout=30, what=f"{a} exited")
                exited = time.monotonic() - killed
                assert proc_a.proc.returncode == ENGINE_DEAD_EXIT, proc_a.tail()
                out_a = proc_a.output()
                assert "worker.engine_dead" in out_a and "service.exit" in out_a
                marks = ("worker.engine_dead", "bus.draining", "vllm engine closed", "service.exit")
                events = [ln[:300] for ln in out_a.splitlines() if any(m in ln for m in marks)]
                # Every request gets its one final frame (no hang: bounded), then room for
                # any duplicate to show up.
                await until(lambda: all(finals(r.id) for r in reqs), timeout=120,
                            what="every request answered")  # fmt: skip
                all_answered = max(arrived.values()) - killed
                await asyncio.sleep(2.0)  # proving a negative: no second answer
                proc_b.check()
                with contextlib.suppress(TimeoutError):
                    await until(lambda: not _running(tree), timeout=15,
                                what="the dead worker's vLLM processes gone")  # fmt: skip
                lingering = _running(tree)
            except BaseException:
                for proc in (proc_a, proc_b):  # pytest shows it with the failure
                    print(f"--- {proc.name} {proc.pid}:\n{proc.tail(60)}")
                raise
            finally:
                for p in tree:  # the dead worker's vLLM processes must not outlive it
                    with contextlib.suppress(psutil.Error):
                        if p.is_running():
                            p.kill()
    await res_sub.unsubscribe()

    ids = {r.id for r in reqs}
    assert set(results) == ids, f"no RES for {ids - set(results)}"
    assert all(n == 1 for n in results.values()), results
    finals_of = {r.id: finals(r.id) for r in reqs}
    assert all(len(f) == 1 for f in finals_of.values()), {k: len(v) for k, v in finals_of.items()}
    by_kind: Counter[str] = Counter()
    redelivered_to_b = 0
    for r in reqs:
        (final,) = finals_of[r.id]
        if final.type == "error":
            assert final.error is not None and final.error.code == "engine_error", final.error
            assert r.stream, "only a request that streamed tokens is answered with the error"
            by_kind["error"] += 1
            continue
        result: Any = final.result
        assert final.type == "end" and result is not None and result.status == "ok", final
        by_kind[f"ok-{result.worker}"] += 1
        if result.worker == b and final.attempt >= 2:
            redelivered_to_b += 1
    assert by_kind["error"] >= 1, (by_kind, answered_before)  # the one streaming on A
    assert redelivered_to_b >= 1, (by_kind, answered_before)  # the unstreamed one on A
    assert not lingering, f"vLLM processes of the dead worker still running: {lingering}"
    wall = time.monotonic() - began
    print(
        f"\nengine death: {dict(by_kind)}, redelivered to {b}: {redelivered_to_b}, "
        f"answered before the kill: {len(answered_before)}; exit {exited:.1f} s and all "
        f"answered {all_answered:.1f} s after the kill; load {killed - started:.1f} s, "
        f"test {wall:.0f} s"
    )
    print("\n".join(events))
