"""The executor's decision for one request: verify, re-validate, gate, run, audit.

The only code that holds database credentials. It runs nothing but the exact
canonical string the validator signed (HMAC over tenant, database, SQL and
policy version), after validating it again under its own copy of the policy
and checking that validation leaves it unchanged; it runs it on the tenant's
own account, whose grants are the last wall.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from switchyard.errors import ErrorCode
from switchyard.logging import get_logger
from switchyard.messages.inference import ErrorInfo
from switchyard.messages.sql import AuditEvent, ExecuteReply, ExecuteRequest
from switchyard.sqldb.connection import Account, DbConnection, open_connection
from switchyard.sqldb.explain import GateLimits, GateVerdict, judge
from switchyard.sqldb.pool import Busy, Pool
from switchyard.sqldb.runner import RunLimits, explain, run_select
from switchyard.sqldb.settings import ExecutorConfig, naming
from switchyard.sqldb.tls import DbTlsError, check_login
from switchyard.sqldb.watchdog import Watchdog
from switchyard.sqlguard import rules
from switchyard.sqlguard.audit import sql_audit
from switchyard.sqlguard.policy import Policy, PolicyStore
from switchyard.sqlguard.signing import verify
from switchyard.sqlguard.validator import validate
from switchyard.sqlguard.verdict import Verdict

log = get_logger(__name__)

VERDICT_CACHE = 4096


@dataclass
class Decision:
    reply: ExecuteReply
    audit: AuditEvent


class SqlExecutor:
    def __init__(self, settings: ExecutorConfig, policies: PolicyStore | None = None) -> None:
        self.settings = settings
        self.naming = naming(settings)
        self.key = settings.sql_signing_key.get_secret_value().encode()
        self.tls = settings.tls_context()
        self.policies = policies or PolicyStore(settings.sql_policy_dir)
        self._pools: dict[str, Pool] = {}
        self._watchdogs: dict[str, Watchdog] = {}
        self._planner: Pool | None = None
        self._verdicts: dict[tuple[str, str, str], Verdict] = {}

    # -- connections -------------------------------------------------------------

    def _account(self, user: str, database: str | None) -> Account:
        s = self.settings
        return Account(
            s.mysql_host, s.mysql_port, user, self.naming.password(user), database, self.tls
        )

    async def check_login(self) -> bool:
        """The start-up check (`sqldb.tls.check_login`) as the planner account, the one
        account every provisioned database has: raises `DbTlsError` when TLS is wrong."""
        s, user = self.settings, self.naming.planner_user
        return await asyncio.to_thread(
            check_login, s.mysql_host, s.mysql_port, user, self.naming.password(user), self.tls
        )

    @property
    def session_seconds(self) -> float:
        """The session's default statement limit: a backstop above every per-statement
        limit and the watchdog, so it never decides which of them fires."""
        s = self.settings
        return s.sql_statement_timeout + s.sql_watchdog_grace + s.sql_client_grace + 1.0

    def _opener(self, account: Account, seconds: float) -> Any:
        async def connect() -> DbConnection:
            return await open_connection(account, statement_seconds=seconds)

        return connect

    def pool(self, tenant: str) -> Pool:
        pool = self._pools.get(tenant)
        if pool is None:
            account = self._account(
                self.naming.tenant_user(tenant), self.naming.tenant_schema(tenant)
            )
            opener = self._opener(account, self.session_seconds)
            pool = Pool(
                f"tenant {tenant}",
                opener,
                size=self.settings.sql_pool_size,
                busy_timeout=self.settings.sql_busy_timeout,
            )
            self._pools[tenant] = pool
            self._watchdogs[tenant] = Watchdog(opener)
        return pool

    def planner(self) -> Pool:
        if self._planner is None:
            account = self._account(self.naming.planner_user, None)
            self._planner = Pool(
                "planner",
                self._opener(account, self.settings.sql_planner_statement_seconds),
                size=self.settings.sql_planner_pool_size,
                busy_timeout=self.settings.sql_busy_timeout,
            )
        return self._planner

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        if self._planner is not None:
            self._planner.close()

    # -- one request -------------------------------------------------------------

    async def handle(self, req: ExecuteRequest) -> Decision:
        started = time.perf_counter()

        def decide(
            verdict: str,
            *,
            rule: str | None = None,
            code: ErrorCode | None = None,
            reason: str | None = None,
            gate: GateVerdict | None = None,
            **extra: Any,
        ) -> Decision:
            duration = time.perf_counter() - started
            plan = gate.plan if gate else []
            reply = ExecuteReply(
                tenant=req.tenant,
                request_id=req.id,
                trace=req.trace,
                ok=verdict == "ok",
                plan=plan,
                gate_passed=gate is not None and gate.ok,
                rows_estimated=gate.rows_estimated if gate else None,
                duration=duration,
                rule=rule,
                error=ErrorInfo(code=code, reason=reason or rule or verdict) if code else None,
                **extra,
            )
            audit = sql_audit(
                tenant=req.tenant,
                request_id=req.id,
                event="sql.execute",
                actor="executor",
                verdict=verdict,
                rule=rule,
                sql=req.canonical_sql,
                plan=plan,
                rows_scanned=reply.rows_examined
                if reply.rows_examined is not None
                else reply.rows_estimated,
                rows_returned=len(reply.rows) if verdict == "ok" else None,
                duration=duration,
                killed=reply.killed,
                kill_reason=reply.kill_reason,
                db_duration=reply.db_duration,
                rows_estimated=reply.rows_estimated,
                truncated=reply.truncated or None,
                database=req.database,
                policy_version=req.policy_version,
                reason=None if verdict == "ok" else reason,
                trace=req.trace,
            )
            return Decision(reply, audit)

        policy, digest, problem = self._policy(req)
        if policy is None:
            return decide(
                "rejected", rule=rules.POLICY_UNKNOWN_TENANT, code="unknown_tenant", reason=problem
            )
        database = policy.database or req.database
        if req.signature is None:
            return decide(
                "rejected",
                rule=rules.SIGNATURE_MISSING,
                code="unauthorized",
                reason="unsigned SQL is never run",
            )
        if not verify(
            self.key,
            req.signature,
            tenant=req.tenant,
            database=database,
            sql=req.canonical_sql,
            policy_version=req.policy_version,
        ):
            return decide(
                "rejected",
                rule=rules.SIGNATURE_INVALID,
                code="unauthorized",
                reason="the signature does not match this tenant, database, SQL and policy",
            )
        if req.policy_version != policy.policy_version:
            return decide(
                "rejected",
                rule=rules.POLICY_STALE,
                code="rejected_sql",
                reason=f"signed under policy {req.policy_version}, now {policy.policy_version}; "
                "validate again",
            )
        again = self._revalidate(req, policy, digest)
        if not again.ok:
            return decide(
                "rejected",
                rule=rules.REVALIDATION_FAILED,
                code="rejected_sql",
                reason=f"re-validation refused it: {again.rule}: {again.detail}",
            )
        if again.sql != req.canonical_sql:
            return decide(
                "rejected",
                rule=rules.REVALIDATION_CHANGED,
                code="rejected_sql",
                reason="the SQL is not in canonical form",
            )
        remaining = req.remaining()
        if remaining is not None and remaining <= 0:
            return decide("rejected", rule=rules.EXEC_EXPIRED, code="expired", reason="deadline")
        timeout = self.settings.sql_statement_timeout
        if remaining is not None:
            timeout = min(timeout, remaining)

        gate: GateVerdict | None = None
        if self.settings.sql_explain_gate or req.gate:
            try:
                gate = await self._explain(req.canonical_sql)
            except Busy as exc:
                return decide("busy", rule=rules.POOL_BUSY, code="no_capacity", reason=exc.reason)
            except (pymysql.err.MySQLError, TimeoutError, OSError, DbTlsError) as exc:
                return decide(
                    "error", rule=rules.EXPLAIN_ERROR, code="db_error", reason=_db_reason(exc)
                )
            if not gate.ok:
                return decide(
                    "rejected", rule=gate.rule, code="rejected_sql", reason=gate.detail, gate=gate
                )
        return await self._run(req, timeout, gate, decide)

    def _policy(self, req: ExecuteRequest) -> tuple[Policy | None, str, str]:
        try:
            found = self.policies.get_with_digest(req.tenant)
        except ValueError as exc:
            return None, "", str(exc)
        if found is None:
            return None, "", f"no SQL policy for tenant {req.tenant}"
        return found[0], found[1], ""

    def _revalidate(self, req: ExecuteRequest, policy: Policy, digest: str) -> Verdict:
        """`validate()` of the signed string under this exact policy content.

        Validation is a pure function of (SQL, policy, database), so a repeat of the
        same statement under the same policy file reuses the verdict. The check that
        validation leaves the string unchanged is the round trip that matters here,
        so the validator's own re-parse is skipped.
        """
        key = (digest, req.database, req.canonical_sql)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = validate(req.canonical_sql, policy, database=req.database, fixpoint=False)
            if len(self._verdicts) >= VERDICT_CACHE:
                self._verdicts.pop(next(iter(self._verdicts)))
            self._verdicts[key] = verdict
        return verdict

    async def _explain(self, sql: str) -> GateVerdict:
        planner = self.planner()
        limits = GateLimits(
            self.settings.sql_explain_max_rows, self.settings.sql_explain_large_table_rows
        )
        async with planner.lease() as lease:
            try:
                plan = await explain(
                    lease.conn, sql, self.settings.sql_planner_statement_seconds + 1
                )
            except Exception:
                lease.broken = True
                raise
        return judge(plan, limits)

    async def _run(
        self, req: ExecuteRequest, timeout: float, gate: GateVerdict | None,
        decide: Callable[..., Decision],
    ) -> Decision:  # fmt: skip
        s = self.settings
        limits = RunLimits(
            timeout=timeout,
            server_timeout=s.sql_server_timeout,
            watchdog_grace=s.sql_watchdog_grace,
            client_grace=s.sql_client_grace,
            max_rows=min(req.max_rows, s.sql_max_rows),
            max_bytes=s.sql_max_bytes,
        )
        pool = self.pool(req.tenant)
        try:
            async with pool.lease() as lease:
                try:
                    out = await run_select(
                        lease, req.canonical_sql, limits, self._watchdogs[req.tenant]
                    )
                except (pymysql.err.MySQLError, OSError):
                    lease.broken = True  # the pool drops it on return
                    raise
        except Busy as exc:
            return decide(
                "busy", rule=rules.POOL_BUSY, code="no_capacity", reason=exc.reason, gate=gate
            )
        # the statement failed in the driver, or could not even connect (DbTlsError: the
        # server stopped offering TLS since start-up)
        except (pymysql.err.MySQLError, OSError, DbTlsError) as exc:
            return decide(
                "error", rule=rules.EXEC_DB_ERROR, code="db_error", reason=_db_reason(exc),
                gate=gate,
            )  # fmt: skip
        common: dict[str, Any] = {
            "db_duration": out.duration,
            "rows_examined": out.rows_examined,
            "killed": out.killed,
            "kill_reason": out.kill_reason,
        }
        if out.killed:
            return decide(
                "killed",
                rule=rules.EXEC_KILLED,
                code="timeout",
                reason=f"stopped after {out.duration:.2f}s ({out.kill_reason}); "
                f"the limit is {timeout:.2f}s",
                gate=gate,
                **common,
            )
        if out.error is not None:
            return decide(
                "error",
                rule=rules.EXEC_DB_ERROR,
                code="db_error",
                reason=f"{out.error_code}: {out.error}",
                gate=gate,
                **common,
            )
        return decide(
            "ok",
            gate=gate,
            columns=out.columns[:512],
            rows=out.rows,
            truncated=out.truncated,
            **common,
        )


def _db_reason(exc: BaseException) -> str:
    if isinstance(exc, pymysql.err.MySQLError) and len(exc.args) > 1:
        return f"{exc.args[0]}: {exc.args[1]}"[:1000]
    return f"{type(exc).__name__}: {exc}"[:1000]
