"""`sy bench route`'s pure parts: the workloads it sends and the numbers it computes.

The runs themselves (a real router and sim workers on NATS) are in
tests/integration/test_bench_route.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from switchyard.bench.peers.clients import Outcome
from switchyard.bench.route import summarise
from switchyard.bench.routeload import (
    AgentStep,
    ChatConfig,
    ChatTurn,
    Run,
    Sent,
    chat_jobs,
    tenant_system_prompt,
)
from switchyard.engines.sim import pseudo_tokens
from switchyard.messages.inference import ModelledTimings


def test_chat_jobs_add_up_and_skew_the_tenants_as_configured() -> None:
    cfg = ChatConfig(tenants=6, conversations=50, turns=3, one_shots=70, seed=1)
    jobs = chat_jobs(cfg)
    assert len(jobs) == 120
    assert sum(len(j.questions) for j in jobs) == cfg.requests == 220
    assert len({j.thread for j in jobs}) == len(jobs)
    requests = Counter[str]()
    for j in jobs:
        requests[j.tenant] += len(j.questions)
    busiest, share = requests.most_common(1)[0]
    assert busiest == "t0"
    assert share / cfg.requests == pytest.approx(cfg.shares()[0], abs=0.02)
    assert 0.35 <= cfg.shares()[0] <= 0.40  # the default skew's busiest tenant, 6 tenants
    assert [r for _, r in sorted(requests.items())] == sorted(requests.values(), reverse=True)


def test_chat_jobs_are_fixed_by_the_seed() -> None:
    cfg = ChatConfig(conversations=10, one_shots=10, seed=3)
    assert chat_jobs(cfg) == chat_jobs(cfg)
    assert chat_jobs(cfg) != chat_jobs(ChatConfig(conversations=10, one_shots=10, seed=4))


def test_each_tenant_has_its_own_system_prompt_of_a_few_hundred_tokens() -> None:
    prompts = [tenant_system_prompt(0, t) for t in range(6)]
    assert len(set(prompts)) == 6
    assert all(300 <= len(pseudo_tokens(p)) <= 500 for p in prompts)


def test_a_turn_repeats_the_conversation_so_far_and_carries_no_session() -> None:
    job = next(j for j in chat_jobs(ChatConfig(turns=3)) if len(j.questions) == 3)
    first = job.turn(0, ())
    third = job.turn(2, ("answer 0", "answer 1"))
    msgs = third.generate_request("pool", deadline=2e9).messages
    assert msgs is not None
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m.content for m in msgs[:2]] == [job.system, job.questions[0]]
    assert msgs[2].content == "answer 0"
    req = first.generate_request("pool", deadline=2e9, stream=False)
    assert (req.session, req.workload, req.tenant, req.stream) == (None, "llm", job.tenant, False)
    assert req.prompt_tokens > len(job.system) // 4  # the estimate counts the system prompt
    body = third.openai_body("sim", stream=False)
    assert "user" not in body and third.headers() == {}
    assert [m["content"] for m in body["messages"]] == [m.content for m in msgs]


def test_an_agent_step_carries_its_session_and_both_frames() -> None:
    req = AgentStep(seed=0, session=7, step=3, history=("a", "b", "c")).generate_request(
        "pool", deadline=2e9
    )
    assert (req.session, req.workload, len(req.images)) == ("s7", "agent", 2)
    # Two 1280x720 frames' visual tokens (880 each in the default profile's) and the text.
    assert req.prompt_tokens > 2 * 880


def _outcome(worker: str, prompt: int, cached: int, queue: float, busy: float) -> Outcome:
    # A third of its decode waited on steps of other requests: busy time is `gpu` only.
    m = ModelledTimings(queue=queue, prefill=busy / 2, decode=busy / 2 * 1.5,
                        total=queue + busy * 1.25, ttft=queue + busy / 2 + 0.01,
                        calibration="a100", gpu=busy)  # fmt: skip
    return Outcome(
        total_s=1.0, worker=worker, prompt_tokens=prompt, cached_tokens=cached,
        completion_tokens=10, modelled=m,
    )  # fmt: skip


def _turn(tenant: str, thread: str, turn: int) -> ChatTurn:
    return ChatTurn(tenant, thread, turn, "sys", ("q",) * (turn + 1), ("a",) * turn, 8)


def test_summarise_counts_stickiness_balance_reach_and_hits() -> None:
    sent = [
        # conversation a: 3 turns, 2 on w0 -> 2/3 sticky
        Sent(_turn("t0", "a", 0), _outcome("w0", 100, 0, 0.0, 1.0)),
        Sent(_turn("t0", "a", 1), _outcome("w0", 200, 100, 0.5, 1.0)),
        Sent(_turn("t0", "a", 2), _outcome("w1", 300, 0, 0.0, 1.0)),
        # conversation b: 2 turns on w1 -> 1.0; a one-shot (not counted for stickiness)
        Sent(_turn("t1", "b", 0), _outcome("w1", 100, 50, 0.0, 2.0)),
        Sent(_turn("t1", "b", 1), _outcome("w1", 100, 100, 0.0, 2.0)),
        Sent(_turn("t0", "o", 0), _outcome("w2", 100, 0, 0.0, 1.0)),
        Sent(_turn("t1", "b", 2), None, "RequestFailed: boom"),
    ]
    r = summarise(Run(sent, wall_s=2.0), ["w0", "w1", "w2", "w3"], duplicates=1)
    assert (r.requests, r.failed, r.first_error, r.duplicates) == (6, 1, "RequestFailed: boom", 1)
    assert r.stickiness == pytest.approx((2 / 3 + 1.0) / 2, abs=1e-4)
    assert r.worker_requests == [2, 3, 1, 0]
    assert r.worker_busy_s == [2.0, 5.0, 1.0, 0.0]
    assert r.load_imbalance == pytest.approx(5.0 / 2.0)
    assert r.tenant_workers == {"t0": 3, "t1": 1}
    assert (r.busiest_tenant, r.busiest_tenant_workers) == ("t0", 3)
    assert r.busiest_tenant_share == pytest.approx(4 / 6, abs=1e-4)
    assert r.prefix_hit_rate == pytest.approx(250 / 900, abs=1e-4)
    assert r.prefix_hit_rate_after_first == pytest.approx(200 / 600, abs=1e-4)
    # TTFT: the sim's modelled first token (queue + prefill + 10 ms here), per request.
    assert r.ttft_p50_ms == pytest.approx(510.0) and r.ttft_p99_ms == pytest.approx(1010.0)
    assert r.request_p99_ms == pytest.approx(2500.0)  # total = queue + 1.25 x busy
    assert r.calibration == ["a100"]  # the figures say which GPU preset they are modelled at
