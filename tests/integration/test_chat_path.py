"""Chat through the fleet: llm.in -> preprocessor -> REQ -> router -> WORK -> worker."""

from __future__ import annotations

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.messages.inference import ChatMessage, ChatRequest, Sampling
from switchyard.token_estimate import estimate_tokens
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)


def test_token_estimate_is_conservative() -> None:
    msgs = [ChatMessage(role="system", content="x" * 400), ChatMessage(role="user", content="hi")]
    assert estimate_tokens(msgs) == (4 + 134) + (4 + 1)


async def test_chat_request_is_prepared_routed_and_answered(
    bus: Bus, unique: str, nats_url: str
) -> None:
    pool = f"c{unique}"
    await provision_pool(bus.js, pool)
    async with (
        router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2),
        worker_in_process(nats_url, pool=pool, engine="llamacpp", assignment="kv",
                          worker_id=f"{pool}-w0", heartbeat_interval=0.3),
        preprocessor_in_process(nats_url, chat_pool=pool),
    ):  # fmt: skip
        await wait_for_pool(bus.js, pool)
        chat = ChatRequest(
            tenant="acme",
            messages=[ChatMessage(role="user", content="Say hello.")],
            sampling=Sampling(max_tokens=12),
        )
        async with TokenStreamReader(bus.nc, idle_timeout=30) as reader:
            await publish(
                bus.js, subjects.llm_in("acme"), chat.model_copy(update={"reply": reader.inbox})
            )
            frames = [f async for f in reader]
    end = frames[-1]
    assert end.type == "end" and end.result and end.result.status == "ok"
    assert end.result.request_id == chat.id  # one id from the edge to the result
    assert end.result.text and end.result.usage.completion_tokens >= 1
    stored = await bus.js.stream_info("INGRESS")
    assert stored.state.messages >= 1  # kept for replay
