"""The pipeline's side of the SQL walls: the validator, then the executor's EXPLAIN gate and run.

The orchestrator holds neither the signing key nor database credentials: it can
only ask the validator to judge SQL and hand the executor what the validator
signed. Whatever a model writes reaches the database through these two calls.
"""

from __future__ import annotations

from switchyard import subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus
from switchyard.messages.sql import ExecuteReply, ExecuteRequest, ValidateReply, ValidateRequest


class GuardClient:
    def __init__(self, bus: Bus, *, timeout: float = 15.0) -> None:
        self.bus = bus
        self.timeout = timeout

    async def validate(
        self, tenant: str, sql: str, database: str, *, question: str | None, trace: str | None
    ) -> ValidateReply:
        req = ValidateRequest(
            tenant=tenant, sql=sql, database=database, question=question, trace=trace
        )
        return await rpc.request(
            self.bus.nc, subjects.SQL_VALIDATE, req, ValidateReply, timeout=self.timeout
        )

    async def run(
        self,
        tenant: str,
        verdict: ValidateReply,
        database: str,
        *,
        max_rows: int,
        gate: bool,
        trace: str | None,
    ) -> ExecuteReply:
        """Execute what the validator signed; `gate`: EXPLAIN-gated even where the
        executor's default is off (the reply carries the gate's plan and verdict)."""
        if not (verdict.ok and verdict.canonical_sql and verdict.policy_version):
            raise ValueError("only an approved verdict can be executed")
        req = ExecuteRequest(
            tenant=tenant,
            canonical_sql=verdict.canonical_sql,
            database=database,
            policy_version=verdict.policy_version,
            signature=verdict.signature,
            max_rows=max_rows,
            gate=gate,
            trace=trace,
        )
        return await rpc.request(
            self.bus.nc, subjects.SQL_EXECUTE, req, ExecuteReply, timeout=self.timeout
        )
