"""`sy bench sql-exec`: the top-metric questions against the raw tables and against the
pre-aggregated ones, through a real executor process over NATS with a fixed pool.

[S0] §3.6: pre-aggregation turned 2 s into 0.15 s, 13x the database's capacity. Both
paths ask the same questions (and must get the same answers); the executor runs
with its EXPLAIN gate off for this, since the gate exists to refuse exactly the raw
path. Paths alternate round by round so machine noise hits both alike.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard import subjects
from switchyard.bench.stats import Report, percentile
from switchyard.bus import rpc
from switchyard.bus.connection import Bus, connect
from switchyard.bus.topology import TopologySettings
from switchyard.config import Settings
from switchyard.fleet import ProcessGroup, nats_server, provision
from switchyard.fleet.readiness import wait_for_responder
from switchyard.messages.sql import ExecuteReply, ExecuteRequest
from switchyard.sqldb import demo
from switchyard.sqldb.admin import connect_admin, dsn_params
from switchyard.sqldb.provision import provision_tenant
from switchyard.sqldb.settings import AdminSettings, naming
from switchyard.sqlguard.policy import PolicyStore
from switchyard.sqlguard.signing import sign
from switchyard.sqlguard.validator import validate


def questions(start: dt.date) -> list[tuple[str, str, str]]:
    """(name, raw SQL, pre-aggregated SQL): the same dashboard question over the whole
    period, answered two ways (the answers are compared before timing)."""
    first = start.isoformat()  # a typed date: no quoting issue in the f-strings below
    return [
        ("dau_by_day",
         "SELECT day, COUNT(*) AS dau FROM daily_activity GROUP BY day ORDER BY day",
         "SELECT day, SUM(dau) AS dau FROM agg_dau_daily GROUP BY day ORDER BY day"),
        ("avg_dau_by_server",
         "SELECT server_id, COUNT(*) / COUNT(DISTINCT day) AS avg_dau FROM daily_activity "
         "GROUP BY server_id ORDER BY server_id",
         "SELECT server_id, SUM(dau) / COUNT(DISTINCT day) AS avg_dau FROM agg_dau_daily "
         "GROUP BY server_id ORDER BY server_id"),
        ("playtime_by_day",
         "SELECT day, SUM(minutes) AS minutes, SUM(sessions) AS sessions FROM daily_activity "
         "GROUP BY day ORDER BY day",
         "SELECT day, SUM(minutes) AS minutes, SUM(sessions) AS sessions FROM agg_dau_daily "
         "GROUP BY day ORDER BY day"),
        ("revenue_by_day_channel",
         "SELECT DATE(created_at) AS day, channel, SUM(amount_cents) AS revenue FROM orders "
         "WHERE status IN ('paid', 'refunded') GROUP BY DATE(created_at), channel "
         "ORDER BY day, channel",
         "SELECT day, channel, SUM(revenue_cents) AS revenue FROM agg_revenue_daily "
         "GROUP BY day, channel ORDER BY day, channel"),
        ("retention_d1_d7",
         "SELECT p.registered_on AS cohort_day, COUNT(*) AS cohort_size, "  # noqa: S608
         "COUNT(a1.player_id) AS d1, COUNT(a7.player_id) AS d7 FROM players p "
         "LEFT JOIN daily_activity a1 ON a1.player_id = p.player_id "
         "AND a1.day = DATE_ADD(p.registered_on, INTERVAL 1 DAY) "
         "LEFT JOIN daily_activity a7 ON a7.player_id = p.player_id "
         "AND a7.day = DATE_ADD(p.registered_on, INTERVAL 7 DAY) "
         f"WHERE p.registered_on >= '{first}' GROUP BY p.registered_on "
         "ORDER BY cohort_day",
         "SELECT cohort_day, SUM(cohort_size) AS cohort_size, SUM(d1) AS d1, SUM(d7) AS d7 "
         "FROM agg_retention GROUP BY cohort_day ORDER BY cohort_day"),
    ]  # fmt: skip


@dataclass
class PathResult:
    requests: int
    queries_per_s: float
    p50_ms: float
    p99_ms: float
    rows_examined_per_query: float


@dataclass
class ExecBench(Report):
    tenant: str
    pool_size: int
    concurrency: int
    rounds: int
    demo_rows: dict[str, int]
    raw: PathResult
    aggregated: PathResult
    ratio: float  # aggregated queries/s over raw queries/s
    p99_ratio: float  # raw p99 over aggregated p99
    answers_match: bool
    per_question_ms: dict[str, dict[str, float]] = field(default_factory=dict)


class Client:
    def __init__(self, bus: Bus, tenant: str, key: str, policies: PolicyStore) -> None:
        self.bus, self.tenant, self.key, self.policies = bus, tenant, key, policies

    def request(self, sql: str) -> ExecuteRequest:
        policy = self.policies.get(self.tenant)
        if policy is None or not policy.database:
            raise RuntimeError(f"no policy for {self.tenant}")
        verdict = validate(sql, policy)
        if not verdict.ok or not verdict.sql or not verdict.policy_version:
            raise RuntimeError(f"benchmark SQL refused: {verdict.rule}: {verdict.detail}")
        signature = sign(self.key.encode(), tenant=self.tenant, database=policy.database,
                         sql=verdict.sql, policy_version=verdict.policy_version)  # fmt: skip
        return ExecuteRequest(tenant=self.tenant, canonical_sql=verdict.sql,
                              database=policy.database, policy_version=verdict.policy_version,
                              signature=signature)  # fmt: skip

    async def run(self, req: ExecuteRequest) -> ExecuteReply:
        fresh = req.model_copy(update={"id": req.id[:20] + secrets.token_hex(3)})
        reply = await rpc.request(
            self.bus.nc, subjects.SQL_EXECUTE, fresh, ExecuteReply, timeout=120
        )
        if not reply.ok:
            raise RuntimeError(f"{reply.rule}: {reply.error.reason if reply.error else ''}")
        return reply


async def _phase(
    client: Client, reqs: list[ExecuteRequest], total: int, concurrency: int
) -> tuple[float, list[float], list[int], dict[int, list[float]]]:
    latencies: list[float] = []
    examined: list[int] = []
    by_question: dict[int, list[float]] = {i: [] for i in range(len(reqs))}
    counter = iter(range(total))

    async def worker() -> None:
        for n in counter:
            i = n % len(reqs)
            t0 = time.perf_counter()
            reply = await client.run(reqs[i])
            elapsed = time.perf_counter() - t0
            latencies.append(elapsed)
            by_question[i].append(elapsed)
            examined.append(reply.rows_examined or 0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies, examined, by_question


async def _bench(
    url: str, ready: Callable[[], None], tenant: str, key: str, policy_dir: Path,
    qs: list[tuple[str, str, str]], requests: int, rounds: int, concurrency: int,
) -> tuple[dict[str, Any], bool, dict[str, dict[str, float]]]:  # fmt: skip
    """`ready` raises if the executor process exited (it is waited for first)."""
    settings = Settings(nats_url=url)
    async with await connect(settings, "sy-bench-sql") as bus:
        client = Client(bus, tenant, key, PolicyStore(policy_dir))
        raw = [client.request(q[1]) for q in qs]
        agg = [client.request(q[2]) for q in qs]
        await wait_for_responder(bus.nc, subjects.SQL_EXECUTE, timeout=30, check=ready)
        match = True
        for r, a in zip(raw, agg, strict=True):  # warm-up, and the answers must agree
            match = match and (await client.run(r)).rows == (await client.run(a)).rows
        totals: dict[str, dict[str, list[Any]]] = {
            p: {"wall": [], "lat": [], "rows": []} for p in ("raw", "agg")
        }
        per_q: dict[str, dict[str, list[float]]] = {q[0]: {"raw": [], "agg": []} for q in qs}
        for _ in range(rounds):
            for path, reqs in (("raw", raw), ("agg", agg)):
                wall, lat, rows, by_q = await _phase(client, reqs, requests, concurrency)
                totals[path]["wall"].append(wall)
                totals[path]["lat"].extend(lat)
                totals[path]["rows"].extend(rows)
                for i, values in by_q.items():
                    per_q[qs[i][0]][path].extend(values)
        medians = {
            name: {p: round(statistics.median(v) * 1000, 2) for p, v in paths.items() if v}
            for name, paths in per_q.items()
        }
        return totals, match, medians


def run_exec_bench(
    *, dsn: str | None, nats_url: str | None, tenant: str, requests: int, rounds: int,
    pool_size: int,
) -> ExecBench:  # fmt: skip
    overrides: dict[str, Any] = {"mysql_dsn": dsn} if dsn else {}
    settings = AdminSettings(**overrides)
    names = naming(settings)
    key = secrets.token_hex(32)
    with tempfile.TemporaryDirectory(prefix="sy-bench-sql-") as tmp:
        policy_dir = Path(tmp)
        conn = connect_admin(settings.mysql_dsn)
        try:
            report = demo.generate(conn, names.ops_db, names.pay_db, settings)
            provision_tenant(
                conn, names, tenant, host=settings.sql_account_host,
                max_connections=max(settings.sql_max_user_connections, pool_size + 2),
                statement_seconds=max(settings.sql_user_statement_seconds, 60),
                planner_statement_seconds=settings.sql_planner_statement_seconds,
                policy_dir=policy_dir, max_limit=settings.sql_max_limit,
            )  # fmt: skip
        finally:
            conn.close()
        db = dsn_params(settings.mysql_dsn)
        qs = questions(settings.sql_demo_start)
        with nats_server(nats_url) as url, ProcessGroup(grace=30) as group:
            asyncio.run(provision(TopologySettings(nats_url=url), streams=("AUDIT",)))
            env = {
                "SY_NATS_URL": url, "SY_MYSQL_HOST": str(db["host"]),
                "SY_MYSQL_PORT": str(db["port"]),
                "SY_SQL_DB_SECRET": naming(settings).secret.decode(),
                "SY_SQL_DEMO_PREFIX": settings.sql_demo_prefix,
                "SY_SQL_SCHEMA_PREFIX": settings.sql_schema_prefix,
                "SY_SQL_ACCOUNT_PREFIX": settings.sql_account_prefix,
                "SY_SQL_SIGNING_KEY": key, "SY_SQL_POLICY_DIR": str(policy_dir),
                "SY_SQL_POOL_SIZE": str(pool_size), "SY_SQL_EXPLAIN_GATE": "false",
                "SY_SQL_BUSY_TIMEOUT": "10", "SY_SQL_STATEMENT_TIMEOUT": "60",
                "SY_LOG_LEVEL": "warning",
            }  # fmt: skip
            executor = group.start("executor", (sys.executable, "-m", "services.executor"), env)
            bench = _bench(url, executor.check, tenant, key, policy_dir, qs, requests, rounds,
                           pool_size)  # fmt: skip
            totals, match, medians = asyncio.run(bench)

    def result(path: str) -> PathResult:
        lat, rows = totals[path]["lat"], totals[path]["rows"]
        wall = sum(totals[path]["wall"])
        return PathResult(
            requests=len(lat), queries_per_s=round(len(lat) / wall, 2),
            p50_ms=round(statistics.median(lat) * 1000, 2),
            p99_ms=round(percentile(lat, 0.99) * 1000, 2),
            rows_examined_per_query=round(sum(rows) / max(1, len(rows)), 1),
        )  # fmt: skip

    raw, aggregated = result("raw"), result("agg")
    return ExecBench(
        tenant=tenant, pool_size=pool_size, concurrency=pool_size, rounds=rounds,
        demo_rows=report.rows, raw=raw, aggregated=aggregated,
        ratio=round(aggregated.queries_per_s / raw.queries_per_s, 2),
        p99_ratio=round(raw.p99_ms / aggregated.p99_ms, 2),
        answers_match=match, per_question_ms=medians,
    )  # fmt: skip
