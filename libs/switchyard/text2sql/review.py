"""The review loop: recent answers read back from `RES`, and promoting one into the
tenant's verified queries (with who verified it and when).

Answers are not kept anywhere else: `RES` already holds every one of them for its
retention window, so reviewing is replaying.
"""

from __future__ import annotations

import datetime as dt
import re
import time

from nats.js import api

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.codec import decode_envelope
from switchyard.errors import DecodeError, SwitchyardError
from switchyard.messages.sql import SqlAnswer
from switchyard.text2sql.knowledge import KnowledgeStore, VerifiedQuery


async def recent_answers(
    bus: Bus, tenant: str, *, since: float = 86_400.0, limit: int = 50
) -> list[SqlAnswer]:
    """The tenant's answers of the last `since` seconds, newest last (at most `limit`)."""
    start = dt.datetime.fromtimestamp(time.time() - since, dt.UTC)
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start
    )
    sub = await bus.js.subscribe(subjects.res("sql", tenant), ordered_consumer=True, config=config)
    answers: list[SqlAnswer] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                break
            try:
                message = decode_envelope(msg.data)
            except DecodeError:
                continue  # RES is shared with inference results; only answers matter here
            if isinstance(message, SqlAnswer):
                answers.append(message)
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return answers[-limit:]


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
