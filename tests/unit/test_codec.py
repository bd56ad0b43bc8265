"""Every message model round-trips through msgpack; every bad payload gets its typed error."""

import time

import msgpack
import pytest

from switchyard.codec import ENVELOPES, decode, decode_envelope, encode
from switchyard.errors import DecodeError
from switchyard.messages.agent import AgentStep, RawFrame
from switchyard.messages.deadletter import DeadLetter
from switchyard.messages.fleet import Assignment, WorkerHeartbeat
from switchyard.messages.inference import (
    Cancel,
    ChatMessage,
    ChatRequest,
    ErrorInfo,
    GenerateRequest,
    GenerateResult,
    GrammarConstraint,
    Image,
    ImagePart,
    JsonSchemaConstraint,
    Sampling,
    TextPart,
    TokenFrame,
    Usage,
)
from switchyard.messages.sql import (
    AuditEvent,
    ExecuteReply,
    ExecuteRequest,
    SqlAnswer,
    SqlAsk,
    StageEvent,
    StageProgress,
    ValidateReply,
    ValidateRequest,
)

NOW = time.time()
SIG = "ab" * 32
HASH = "0123456789abcdef0123456789abcdef"

SAMPLES = [
    AgentStep(
        tenant="t1",
        session="ep-1",
        frame_ts=NOW,
        frames=[RawFrame(data=b"\x89PNG....")],
        history=["click(1,2)"],
    ),
    ChatRequest(
        tenant="t1",
        messages=[ChatMessage(role="user", content="hi")],
        sampling=Sampling(max_tokens=16, seed=7, stop=["\n"]),
    ),
    GenerateRequest(
        tenant="t1",
        workload="agent",
        session="ep-1",
        frame_ts=NOW,
        stale_after=2.0,
        messages=[ChatMessage(role="user", content=[TextPart(text="tap"), ImagePart(hash=HASH)])],
        images=[Image(hash=HASH, data=b"\xff\xd8jpeg", mime="image/jpeg", width=1280, height=720)],
        constraint=JsonSchemaConstraint(json_schema={"type": "object"}),
        prompt_tokens=900,
    ),
    GenerateRequest(
        tenant="t2",
        workload="sql",
        prompt="SELECT",
        lora="t2",
        cache_salt="t2",
        constraint=GrammarConstraint(gbnf='root ::= "x"'),
    ),
    GenerateResult(
        tenant="t1",
        request_id="R1",
        workload="llm",
        status="ok",
        text="hello",
        finish_reason="stop",
        usage=Usage(prompt_tokens=3, completion_tokens=1),
    ),
    GenerateResult(
        tenant="t1",
        request_id="R1",
        workload="agent",
        status="stale",
        error=ErrorInfo(code="stale", reason="frame is 3.1 s old"),
    ),
    Cancel(tenant="t1", request_id="R1"),
    SqlAsk(tenant="t1", question="DAU yesterday?"),
    ValidateRequest(tenant="t1", sql="SELECT 1", database="game_ops"),
    ValidateReply(
        tenant="t1",
        request_id="R1",
        ok=True,
        canonical_sql="SELECT 1",
        policy_version="1",
        signature=SIG,
        checks=["single_statement"],
    ),
    ExecuteRequest(
        tenant="t1",
        canonical_sql="SELECT 1",
        database="game_ops",
        policy_version="1",
        signature=SIG,
    ),
    ExecuteReply(tenant="t1", request_id="R1", ok=True, columns=["a"], rows=[[1], [None]]),
    StageEvent(tenant="t1", request_id="R1", stage="sql", data={"sql": "SELECT 1"}),
    StageProgress(tenant="t1", request_id="R1", stage="sql", seconds=9.5, elapsed=12.0, tokens=7),
    SqlAnswer(
        tenant="t1",
        request_id="R1",
        status="ok",
        path="verified",
        question="n?",
        sql="SELECT 1",
        columns=["1"],
        rows=[[1]],
        stages={"rows": 0.01},
    ),
    AuditEvent(tenant="t1", request_id="R1", event="sql.validate", actor="validator", verdict="ok"),
]
PLAIN = [
    TokenFrame(seq=0, type="delta", text="he", tokens=1),
    DeadLetter(
        subject="work.agent.p1",
        stream="WORK",
        consumer="c",
        stream_seq=4,
        deliveries=6,
        code="schema",
        reason="bad",
        at=NOW,
        payload=b"\x00",
    ),
    WorkerHeartbeat(worker="w1", pool="agent", engine="sim", at=NOW, slots=4, partitions=[1, 2]),
    Assignment(pool="agent", partition=3, worker="w1", at=NOW),
    ErrorInfo(code="over_quota", reason="ITPM", retry_after=1.5),
]


@pytest.mark.parametrize("message", SAMPLES + PLAIN, ids=lambda m: type(m).__name__)
def test_round_trip(message: object) -> None:
    data = encode(message)  # type: ignore[arg-type]
    assert decode(data, type(message)) == message  # type: ignore[arg-type]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_decode_envelope_picks_the_model_by_kind(message: object) -> None:
    assert decode_envelope(encode(message)) == message  # type: ignore[arg-type]


def test_every_envelope_kind_has_a_sample() -> None:
    assert {m.kind for m in SAMPLES} == set(ENVELOPES)  # type: ignore[attr-defined]


def _code(data: bytes, model: type = ChatRequest, **kw: int) -> str:
    with pytest.raises(DecodeError) as info:
        decode(data, model, **kw)
    assert info.value.reason  # always says why
    return info.value.code


def test_malformed() -> None:
    assert _code(b"\xc1\xc1\xc1") == "malformed"  # 0xc1 is never used by msgpack
    assert _code(b'{"json": true}') in {"malformed", "schema"}
    assert _code(encode(SAMPLES[1]) + b"\x00") == "malformed"  # trailing garbage


def test_truncated() -> None:
    data = encode(SAMPLES[1])
    for cut in (1, len(data) // 2, len(data) - 1):
        assert _code(data[:cut]) == "truncated"
    assert _code(b"") == "truncated"


def test_oversized_payload_and_fields() -> None:
    data = encode(SAMPLES[1])
    assert _code(data, max_bytes=len(data) - 1) == "oversized"
    obj = msgpack.unpackb(data)
    obj["messages"][0]["content"] = "x" * (300 * 1024)
    assert _code(msgpack.packb(obj)) == "oversized"
    obj = msgpack.unpackb(data)
    obj["messages"] = obj["messages"] * 300
    assert _code(msgpack.packb(obj)) == "oversized"


def test_wrong_version() -> None:
    obj = msgpack.unpackb(encode(SAMPLES[1]))
    obj["v"] = 2
    assert _code(msgpack.packb(obj)) == "version"


def test_schema_errors_are_strict() -> None:
    obj = msgpack.unpackb(encode(SAMPLES[1]))
    obj["priority"] = "5"  # strict: no str -> int coercion
    assert _code(msgpack.packb(obj)) == "schema"
    obj = msgpack.unpackb(encode(SAMPLES[1]))
    obj["surprise"] = 1  # closed models
    assert _code(msgpack.packb(obj)) == "schema"
    obj = msgpack.unpackb(encode(SAMPLES[1]))
    obj["tenant"] = "../etc"  # tenants are subject tokens
    assert _code(msgpack.packb(obj)) == "schema"
    assert _code(msgpack.packb([1, 2, 3])) == "schema"
    with pytest.raises(DecodeError, match="unknown message kind") as info:
        decode_envelope(msgpack.packb({"v": 1, "kind": "nope"}))
    assert info.value.code == "schema"


def test_generate_request_needs_exactly_one_input() -> None:
    obj = msgpack.unpackb(encode(SAMPLES[3]))
    obj["messages"] = [{"role": "user", "content": "x"}]
    assert _code(msgpack.packb(obj), GenerateRequest) == "schema"
