"""The outcome of validating one statement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Verdict:
    """Either `ok` with the canonical SQL to run, or a rejection with its rule id.

    `node` names the offending part of the statement (its expression class and a
    short rendering), so a generator retrying the question knows what to change.
    """

    ok: bool
    sql: str | None = None
    rule: str | None = None
    detail: str | None = None
    node: str | None = None
    policy_version: str | None = None
    checks: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    limit_action: Literal["injected", "clamped"] | None = None

    def as_line(self) -> dict[str, Any]:
        """The JSON object `sy sql check` prints for this verdict."""
        if self.ok:
            return {"ok": True, "sql": self.sql}
        detail = self.detail or ""
        if self.node:
            detail = f"{detail} [at {self.node}]"
        return {"ok": False, "rule": self.rule, "detail": detail}
