"""The review loop: recent answers read back from `RES`, and promoting one into the
tenant's verified queries (with who verified it and when).

Answers are not kept anywhere else: `RES` already holds every one of them for its
retention window, so reviewing is replaying.
"""

from __future__ import annotations

import datetime as dt
import re
import time

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.streamread import Window, read
from switchyard.codec import envelope_or_none
from switchyard.errors import SwitchyardError
from switchyard.messages.sql import AuditEvent, SqlAnswer
from switchyard.text2sql.knowledge import KnowledgeStore, VerifiedQuery


async def recent_answers(
    bus: Bus, tenant: str, *, since: float = 86_400.0, limit: int = 50
) -> list[SqlAnswer]:
    """The tenant's answers of the last `since` seconds, newest last (at most `limit`)."""
    window = Window(subject=subjects.res("sql", tenant), since=time.time() - since)
    answers: list[SqlAnswer] = []
    async for stored in read(bus.js, "RES", window):
        # RES is shared with inference results; only answers matter here
        message = envelope_or_none(stored.data)
        if isinstance(message, SqlAnswer):
            answers.append(message)
    return answers[-limit:]


async def review_requests(
    bus: Bus, tenant: str, *, since: float = 86_400.0, limit: int = 50
) -> list[AuditEvent]:
    """Questions and SQL the tenant's analysts asked to have reviewed (the console's
    "request review": audit events on `audit.review.<tenant>`), newest last."""
    window = Window(subject=subjects.audit("review", tenant), since=time.time() - since)
    requests: list[AuditEvent] = []
    async for stored in read(bus.js, "AUDIT", window):
        message = envelope_or_none(stored.data)
        if isinstance(message, AuditEvent) and message.tenant == tenant:
            requests.append(message)
    return requests[-limit:]


def unqualified(sql: str, database: str) -> str:
    """Canonical SQL names the tenant's schema; verified SQL is written without it."""
    return re.sub(rf"`{re.escape(database)}`\.", "", sql)


def promote(
    store: KnowledgeStore,
    answer: SqlAnswer,
    *,
    verified_by: str,
    database: str,
    tags: list[str] | None = None,
) -> VerifiedQuery:
    """Add `answer`'s question and SQL to its tenant's verified queries."""
    if answer.status != "ok" or not answer.sql:
        raise SwitchyardError(
            f"answer {answer.request_id} has no executed SQL to verify ({answer.status})",
            code="invalid_request",
        )
    query = VerifiedQuery(
        id=store.next_verified_id(answer.tenant),
        question=answer.question,
        sql=unqualified(answer.sql, database),
        verified_by=verified_by,
        verified_at=dt.datetime.now(dt.UTC),
        tags=tags or [],
    )
    store.add_verified(answer.tenant, query)
    return query
