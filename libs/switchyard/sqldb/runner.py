"""Running one canonical SELECT: read-only transaction, time limits, watchdog, caps.

Three clocks, tightest first: the server's own limit (MariaDB `SET STATEMENT
max_statement_time=... FOR`, MySQL `max_execution_time`) at the deadline; the
watchdog's `KILL QUERY` at deadline + grace; the client's `wait_for` at
deadline + client grace, after which the connection is dropped rather than
trusted. Rows stream through an unbuffered cursor and stop counting at the
row and byte caps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiomysql  # type: ignore[import-untyped]
import pymysql

from switchyard.sqldb.cells import Cell, cell_size, to_cell
from switchyard.sqldb.connection import DbConnection
from switchyard.sqldb.pool import Lease
from switchyard.sqldb.watchdog import Watchdog

FETCH_BATCH = 256


# Why a statement was stopped (`RunOutcome.kill_reason`).
KILL_REASONS = ("server_timeout", "watchdog", "watchdog_late", "client_deadline")


@dataclass
class RunOutcome:
    columns: list[str] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)
    truncated: bool = False
    rows_examined: int | None = None
    duration: float = 0.0
    killed: bool = False
    kill_reason: str | None = None  # one of KILL_REASONS
    error: str | None = None
    error_code: int | None = None


@dataclass(frozen=True)
class RunLimits:
    timeout: float
    server_timeout: bool
    watchdog_grace: float
    client_grace: float
    max_rows: int
    max_bytes: int


async def read_counters(conn: DbConnection) -> int:
    async with conn.raw.cursor() as cur:
        await cur.execute(conn.flavour.read_counters_sql())
        rows = await cur.fetchall()
    return sum(int(value) for _, value in rows)


async def _fetch(conn: DbConnection, statement: str, limits: RunLimits, out: RunOutcome) -> None:
    size = 0
    async with conn.raw.cursor(aiomysql.SSCursor) as cur:
        await cur.execute("START TRANSACTION READ ONLY")
        await cur.execute(statement)
        out.columns = [str(d[0])[:256] for d in cur.description or ()]
        while True:
            batch = await cur.fetchmany(FETCH_BATCH)
            if not batch:
                break
            for raw in batch:
                if out.truncated:
                    continue  # drain what the LIMIT lets through; the cap is already met
                row = [to_cell(v) for v in raw]
                weight = sum(cell_size(c) for c in row)
                if len(out.rows) >= limits.max_rows or size + weight > limits.max_bytes:
                    out.truncated = True
                    continue
                out.rows.append(row)
                size += weight


async def _end_transaction(conn: DbConnection) -> None:
    async with conn.raw.cursor() as cur:
        await cur.execute("ROLLBACK")


async def bounded(conn: DbConnection, work: Any, timeout: float) -> Any:
    """`await work` for at most `timeout` s; past that the connection is closed first,
    so a read blocked on the server fails at once instead of holding up the cancel."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        return task.result()
    with contextlib.suppress(Exception):
        conn.close()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise TimeoutError(f"no answer from the database within {timeout:.3f}s")


def _error_code(exc: BaseException) -> int | None:
    if exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


async def run_select(lease: Lease, sql: str, limits: RunLimits, watchdog: Watchdog) -> RunOutcome:
    conn = lease.conn
    flavour = conn.flavour
    out = RunOutcome()
    before = await read_counters(conn)
    statement = sql
    if limits.server_timeout:
        if flavour.is_mariadb:
            statement = flavour.timed(sql, limits.timeout)
        else:
            async with conn.raw.cursor() as cur:
                await cur.execute(flavour.session_timeout(limits.timeout))
    started = time.monotonic()
    async with watchdog.guard(conn.thread_id, limits.timeout + limits.watchdog_grace) as watch:
        try:
            await bounded(
                conn, _fetch(conn, statement, limits, out), limits.timeout + limits.client_grace
            )
        except TimeoutError:
            out.killed, out.kill_reason = True, "client_deadline"
            lease.broken = True  # mid-protocol: never reuse it
        except pymysql.err.MySQLError as exc:
            code = _error_code(exc)
            if code in flavour.interrupted_errors:
                out.killed = True
                out.kill_reason = "watchdog" if watch.fired else "server_timeout"
            else:
                out.error = str(exc.args[1] if len(exc.args) > 1 else exc)[:1000]
                out.error_code = code
            out.rows, out.truncated = [], False
        except Exception as exc:  # the connection state is unknown: drop it
            lease.broken = True
            out.error = f"{type(exc).__name__}: {exc}"[:1000]
    out.duration = time.monotonic() - started
    if watch.fired and not out.killed:
        # The kill raced the statement's end; what came back is complete but late.
        out.kill_reason = "watchdog_late"
    if not lease.broken:
        try:
            await _end_transaction(conn)
            out.rows_examined = max(0, await read_counters(conn) - before)
        except Exception:
            lease.broken = True
    return out


async def explain(conn: DbConnection, sql: str, timeout: float) -> list[dict[str, Any]]:
    """The plan rows of `sql`, keys lowercased (`id`, `table`, `type`, `rows`, `extra`, ...)."""

    async def run() -> list[dict[str, Any]]:
        async with conn.raw.cursor() as cur:
            await cur.execute(f"EXPLAIN {sql}")
            names = [str(d[0]).lower() for d in cur.description or ()]
            rows = await cur.fetchall()
        return [dict(zip(names, row, strict=False)) for row in rows]

    result: list[dict[str, Any]] = await bounded(conn, run(), timeout)
    return result
