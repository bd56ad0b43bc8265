"""The outermost LIMIT: injected when missing, clamped (or refused) when too large."""

from __future__ import annotations

from typing import Literal

from sqlglot import exp

from switchyard.sqlguard import rules
from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.rules import Rejection
from switchyard.sqlguard.scopecheck import describe


def _literal_int(node: exp.Expr | None, what: str) -> int:
    if (
        isinstance(node, exp.Literal)
        and not node.is_string
        and node.this.isdigit()
        and len(node.this) <= 18
    ):
        return int(node.this)
    raise Rejection(
        rules.LIMIT_NOT_LITERAL,
        f"{what} must be a plain non-negative integer",
        describe(node) if node is not None else what,
    )


def apply_limit(root: exp.Expr, policy: Policy) -> Literal["injected", "clamped"] | None:
    """Enforce `policy.max_limit` on the rows `root` returns; what was done, if anything."""
    cap = policy.max_limit
    offset = root.args.get("offset")
    if offset is not None:
        _literal_int(offset.args.get("expression"), "OFFSET")
    limit = root.args.get("limit")
    if limit is None:
        if policy.on_missing_limit == "reject":
            raise Rejection(rules.LIMIT_MISSING, f"a LIMIT of at most {cap} is required")
        root.set("limit", exp.Limit(expression=exp.Literal.number(cap)))
        return "injected"
    if not isinstance(limit, exp.Limit) or set(k for k, v in limit.args.items() if v) - {
        "expression"
    }:
        raise Rejection(rules.LIMIT_NOT_LITERAL, "unsupported LIMIT form", describe(limit))
    value = _literal_int(limit.args.get("expression"), "LIMIT")
    if value <= cap:
        return None
    if policy.on_oversized_limit == "reject":
        raise Rejection(rules.LIMIT_TOO_LARGE, f"LIMIT {value} is over the cap of {cap}")
    limit.set("expression", exp.Literal.number(cap))
    return "clamped"
