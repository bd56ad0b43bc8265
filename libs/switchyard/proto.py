"""`proto/`: JSON Schemas of every message model and an AsyncAPI 3 document of every subject.

Generated from the code (`sy proto --write`); `sy proto --check` and a test fail
when the committed files drift from the models, the topology or who sends and receives
each subject (`switchyard.bus.ownership`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from switchyard.bus.ownership import receivers, senders
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.messages.agent import AgentStep
from switchyard.messages.agentwindow import WindowFrame
from switchyard.messages.deadletter import DeadLetter
from switchyard.messages.fleet import (
    Assignment,
    RouterLease,
    SessionRoute,
    TenantStatus,
    WorkerHeartbeat,
)
from switchyard.messages.idempotency import Claim
from switchyard.messages.inference import (
    Cancel,
    ChatRequest,
    ErrorInfo,
    GenerateRequest,
    GenerateResult,
    NewestStep,
    TokenFrame,
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

MODELS: tuple[type[BaseModel], ...] = (
    AgentStep,
    ChatRequest,
    GenerateRequest,
    GenerateResult,
    TokenFrame,
    Cancel,
    NewestStep,
    ErrorInfo,
    SqlAnswer,
    SqlAsk,
    ValidateRequest,
    ValidateReply,
    ExecuteRequest,
    ExecuteReply,
    StageEvent,
    StageProgress,
    AuditEvent,
    DeadLetter,
    WorkerHeartbeat,
    Assignment,
    SessionRoute,
    TenantStatus,
    RouterLease,
    Claim,
    WindowFrame,
)


@dataclass(frozen=True)
class Channel:
    name: str
    address: str
    messages: tuple[type[BaseModel], ...]
    description: str
    transport: str  # which stream stores it, or "core NATS"


CHANNELS: tuple[Channel, ...] = (
    Channel("agentIn", "agent.in.{tenant}", (AgentStep,), "Agent steps from cloud phones.",
            "stream INGRESS"),
    Channel("sqlIn", "sql.in.{tenant}", (SqlAsk,), "Questions for Text2SQL.",
            "stream INGRESS"),
    Channel("llmIn", "llm.in.{tenant}", (ChatRequest,), "OpenAI-style chat requests.",
            "stream INGRESS"),
    Channel("llmEdge", "llm.edge.{tenant}", (ChatRequest,),
            "The record of a chat the edge prepared and sent to req.llm itself, kept for "
            "replay and trace; nothing consumes it (sy replay sends it on llm.in).",
            "stream INGRESS"),
    Channel("req", "req.{workload}.{tenant}", (GenerateRequest,),
            "Prepared inference requests the router schedules.",
            "stream REQ"),
    Channel("work", "work.{pool}.p{partition}", (GenerateRequest,),
            "Dispatched work for the worker owning the partition.",
            "stream WORK"),
    Channel("res", "res.{workload}.{tenant}", (GenerateResult, SqlAnswer),
            "Final results: of inference requests, and (sql.answer) of questions.",
            "stream RES"),
    Channel("audit", "audit.{kind}.{tenant}", (AuditEvent,), "Audited decisions.",
            "stream AUDIT"),
    Channel("deadLetter", "dlq.{subject}", (DeadLetter,),
            "Messages given up on, with the reason.", "stream DLQ"),
    Channel("replyInbox", "{inbox}", (TokenFrame,),
            "Token stream of one request: ordered frames ending with one end or error frame.",
            "core NATS"),
    Channel("sqlReplyInbox", "{inbox}", (StageEvent, StageProgress, SqlAnswer),
            "Stages of one question as they happen, a progress frame every few seconds "
            "while it is worked on (silence: the orchestrator is gone), ending with its answer.",
            "core NATS"),
    Channel("cancel", "cancel.{requestId}", (Cancel,), "Cancel a queued or running request.",
            "core NATS"),
    Channel("supersede", "supersede.{tenant}", (NewestStep,),
            "A session's newest admitted agent step: older steps not yet started are "
            "answered superseded.", "core NATS"),
    Channel("sqlValidate", "svc.sql.validate", (ValidateRequest, ValidateReply, ErrorInfo),
            "Request/reply: validate SQL for a tenant.", "core NATS"),
    Channel("sqlExecute", "svc.sql.execute", (ExecuteRequest, ExecuteReply, ErrorInfo),
            "Request/reply: run signed canonical SQL.", "core NATS"),
    Channel("fleetWorkers", "$KV.fleet_workers.{worker}", (WorkerHeartbeat,),
            "Worker heartbeats (KV with TTL).", "KV fleet_workers"),
    Channel("fleetAssignments", "$KV.fleet_assignments.{pool}.p{partition}", (Assignment,),
            "Partition ownership (KV, compare-and-set).", "KV fleet_assignments"),
    Channel("fleetSessions", "$KV.fleet_sessions.{pool}.{tenant}.{session}", (SessionRoute,),
            "Session -> worker, written by routers with create/compare-and-set (KV with TTL).",
            "KV fleet_sessions"),
    Channel("fleetTenants", "$KV.fleet_tenants.{tenant}.{router}", (TenantStatus,),
            "Each tenant's usage at the admitting router, every second (KV with TTL); a router "
            "taking over the lease starts from it.", "KV fleet_tenants"),
    Channel("fleetRouter", "$KV.fleet_router.pools.{pools}", (RouterLease,),
            "The lease of the one router that admits for these pools (KV, create and "
            "compare-and-set, TTL = the lease).", "KV fleet_router"),
    Channel("idempotency", "$KV.idempotency.{tenant}.{keyHash}", (Claim,),
            "Idempotency-Key -> the request that owns it and, once done, its result (KV, create).",
            "KV idempotency"),
    Channel("agentWindows", "$KV.agent_windows.{pool}.{tenant}.{session}.{step}", (WindowFrame,),
            "An agent session's window frames, one per step, for the window layout (KV with TTL).",
            "KV agent_windows"),
)  # fmt: skip


def schemas() -> dict[str, dict[str, Any]]:
    return {m.__name__: m.model_json_schema(mode="validation") for m in MODELS}


def asyncapi() -> dict[str, Any]:
    topo = build_topology(TopologySettings())
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for ch in CHANNELS:
        params = {
            p.split("}")[0]: {"description": p.split("}")[0]} for p in ch.address.split("{")[1:]
        }
        channels[ch.name] = {
            "address": ch.address,
            "description": f"{ch.description} Transport: {ch.transport}. Encoding: msgpack.",
            "messages": {
                m.__name__: {"$ref": f"#/components/messages/{m.__name__}"} for m in ch.messages
            },
            **({"parameters": params} if params else {}),
        }
        sides = (("send", senders(ch.name)), ("receive", receivers(ch.name, topo)))
        for role, services in sides:
            if not services:
                continue  # a record no service reads (`llmEdge`)
            operations[f"{role}{ch.name[0].upper()}{ch.name[1:]}"] = {
                "action": role,
                "channel": {"$ref": f"#/channels/{ch.name}"},
                "summary": f"{'Sent' if role == 'send' else 'Received'} by {', '.join(services)}",
            }
    messages = {
        m.__name__: {
            "name": m.__name__,
            "contentType": "application/msgpack",
            "payload": {"$ref": f"./schemas/{m.__name__}.json"},
        }
        for m in MODELS
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Switchyard",
            "version": "1",
            "description": "Every subject of the Switchyard fleet. Messages are msgpack maps "
            "validated by the JSON Schemas beside this file. JetStream streams: "
            + "; ".join(
                f"{s.name} ({s.retention}) on {', '.join(s.subjects)}" for s in topo.streams
            ),
        },
        "defaultContentType": "application/msgpack",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def render() -> dict[str, str]:
    """Relative path -> file text of everything under `proto/`."""
    files = {
        f"schemas/{name}.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in schemas().items()
    }
    files["asyncapi.yaml"] = yaml.safe_dump(asyncapi(), sort_keys=False, width=100)
    return files


def write(root: Path) -> None:
    (root / "schemas").mkdir(parents=True, exist_ok=True)
    wanted = render()
    for old in (root / "schemas").glob("*.json"):
        if f"schemas/{old.name}" not in wanted:
            old.unlink()
    for rel, text in wanted.items():
        (root / rel).write_text(text)


def drift(root: Path) -> list[str]:
    """Files under `root` that differ from what the code generates."""
    wanted = render()
    stale = [
        rel
        for rel, text in wanted.items()
        if not (root / rel).exists() or (root / rel).read_text() != text
    ]
    extra = [
        f"schemas/{p.name}"
        for p in (root / "schemas").glob("*.json")
        if f"schemas/{p.name}" not in wanted
    ]
    return sorted(stale + extra)
