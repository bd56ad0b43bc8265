"""The validator's decision for one request: verdict, signature, audit event.

Pure apart from reading the tenant's policy file: no database, no model, no
network (the caller publishes the audit event and sends the reply).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from switchyard.messages.inference import ErrorInfo
from switchyard.messages.sql import AuditEvent, ValidateReply, ValidateRequest
from switchyard.sqlguard import rules
from switchyard.sqlguard.audit import sql_audit
from switchyard.sqlguard.policy import PolicyStore
from switchyard.sqlguard.signing import sign
from switchyard.sqlguard.validator import validate
from switchyard.sqlguard.verdict import Verdict


@dataclass
class Approver:
    policies: PolicyStore
    key: bytes

    def decide(self, req: ValidateRequest) -> tuple[ValidateReply, AuditEvent, Verdict]:
        started = time.perf_counter()
        broken: str | None = None
        try:
            policy = self.policies.get(req.tenant)
        except ValueError as exc:  # an unreadable policy file: refuse, say why
            policy, broken = None, str(exc)
        if policy is None:
            verdict = Verdict(
                False,
                rule=rules.POLICY_UNKNOWN_TENANT,
                detail=broken or f"no SQL policy for tenant {req.tenant}",
            )
        else:
            verdict = validate(req.sql, policy, database=req.database)
        signature = None
        if verdict.ok and policy is not None and verdict.sql and verdict.policy_version:
            signature = sign(
                self.key,
                tenant=req.tenant,
                database=policy.database or req.database,
                sql=verdict.sql,
                policy_version=verdict.policy_version,
            )
        reply = ValidateReply(
            tenant=req.tenant,
            request_id=req.id,
            trace=req.trace,
            ok=verdict.ok,
            canonical_sql=verdict.sql,
            policy_version=verdict.policy_version,
            signature=signature,
            checks=list(verdict.checks),
            tables=list(verdict.tables)[:256],
            limit_action=verdict.limit_action,
            rule=verdict.rule,
            node=(verdict.node or "")[:256] or None,
            error=None
            if verdict.ok
            else ErrorInfo(code="rejected_sql", reason=verdict.detail or verdict.rule or "?"),
        )
        event = sql_audit(
            tenant=req.tenant,
            request_id=req.id,
            event="sql.validate",
            actor="validator",
            verdict="ok" if verdict.ok else "rejected",
            rule=verdict.rule,
            question=req.question,
            # The statement as submitted: a rejected one is evidence, an accepted one is
            # also recorded in its canonical form.
            sql=req.sql,
            duration=time.perf_counter() - started,
            canonical_sql=verdict.sql,
            policy_version=verdict.policy_version,
            database=req.database,
            node=verdict.node,
            limit_action=verdict.limit_action,
            trace=req.trace,
        )
        return reply, event, verdict
