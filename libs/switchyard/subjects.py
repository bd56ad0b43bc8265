"""Subject names, built in one place so no service spells one by hand."""

from __future__ import annotations

import re

from switchyard.messages.inference import Workload

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _token(value: str, what: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"{what} {value!r} is not a valid subject token")
    return value


def agent_in(tenant: str) -> str:
    return f"agent.in.{_token(tenant, 'tenant')}"


def sql_in(tenant: str) -> str:
    return f"sql.in.{_token(tenant, 'tenant')}"


def llm_in(tenant: str) -> str:
    return f"llm.in.{_token(tenant, 'tenant')}"


def llm_edge(tenant: str) -> str:
    """INGRESS's record of a chat the edge prepared and sent to `req.llm.<tenant>` itself:
    kept for replay and trace, consumed by nobody (`ingress_runnable`)."""
    return f"llm.edge.{_token(tenant, 'tenant')}"


def ingress_runnable(subject: str) -> str:
    """The subject that runs a request stored on INGRESS at `subject`: itself, except the
    edge's chat record (`llm.edge.<t>`), whose chat runs from `llm.in.<t>`."""
    return llm_in(tenant_of(subject)) if subject.startswith("llm.edge.") else subject


def req(workload: Workload, tenant: str) -> str:
    return f"req.{workload}.{_token(tenant, 'tenant')}"


def work(pool: str, partition: int) -> str:
    return f"work.{_token(pool, 'pool')}.p{partition}"


def work_consumer(pool: str, partition: int) -> str:
    """Durable consumer name of one WORK partition (one per partition)."""
    return f"work-{_token(pool, 'pool')}-p{partition}"


def res(workload: Workload, tenant: str) -> str:
    return f"res.{workload}.{_token(tenant, 'tenant')}"


def audit(kind: str, tenant: str) -> str:
    return f"audit.{_token(kind, 'kind')}.{_token(tenant, 'tenant')}"


def cancel(request_id: str) -> str:
    return f"cancel.{_token(request_id, 'request id')}"


def supersede(tenant: str) -> str:
    """Core NATS: a session's newest agent step (`NewestStep`), for routers and workers."""
    return f"supersede.{_token(tenant, 'tenant')}"


def dead_letter(subject: str) -> str:
    return f"dlq.{subject}"


def tenant_of(subject: str) -> str:
    """The tenant token of `<family>.<kind>.<tenant>` subjects (ingress, req, res, audit)."""
    parts = subject.split(".")
    if len(parts) != 3:
        raise ValueError(f"subject {subject!r} has no tenant token")
    return parts[2]


SQL_VALIDATE = "svc.sql.validate"
SQL_EXECUTE = "svc.sql.execute"
CANCEL_ALL = "cancel.*"
SUPERSEDE_ALL = "supersede.*"
RES_ALL = "res.>"  # every result, of every workload and tenant
