"""Rule ids of the SQL guard, and the rejection that carries one.

A rule id is a stable, machine-readable name (`family.reason`): the generator
that wrote the SQL, the audit trail and the tests act on it, so ids are never
reworded; a new reason gets a new id. `RULESET_VERSION` changes whenever the
meaning of a rule changes, and is part of every signed verdict.
"""

from __future__ import annotations

from typing import Final

RULESET_VERSION: Final = "sqlguard-1"

# Raw input, before any parsing.
INPUT_EMPTY: Final = "input.empty"
INPUT_MALFORMED: Final = "input.malformed"
INPUT_TOO_LONG: Final = "input.too_long"
INPUT_CONTROL_CHAR: Final = "input.control_char"
INPUT_INVISIBLE_CHAR: Final = "input.invisible_char"
INPUT_NON_ASCII: Final = "input.non_ascii"
INPUT_TOO_MANY_TOKENS: Final = "input.too_many_tokens"
INPUT_TOO_DEEP: Final = "input.too_deep"
COMMENT_EXECUTABLE: Final = "comment.executable"
COMMENT_HINT: Final = "comment.hint"

# Parsing: any surprise of the parser is a rejection (fail closed).
PARSE_ERROR: Final = "parse.error"
PARSE_RECURSION: Final = "parse.recursion"

# Statement shape.
STATEMENT_MULTIPLE: Final = "statement.multiple"
STATEMENT_TYPE: Final = "statement.type"

# The expression tree.
SYNTAX_NODE: Final = "syntax.node"
SYNTAX_FUNCTION: Final = "syntax.function"
SYNTAX_VARIABLE: Final = "syntax.variable"
SYNTAX_PLACEHOLDER: Final = "syntax.placeholder"
SYNTAX_INTO: Final = "syntax.into"
SYNTAX_LOCK: Final = "syntax.lock"
SYNTAX_HINT: Final = "syntax.hint"
SYNTAX_MODIFIER: Final = "syntax.modifier"
SYNTAX_KEYWORD: Final = "syntax.keyword"
SYNTAX_NATURAL_JOIN: Final = "syntax.natural_join"
SYNTAX_STAR: Final = "syntax.star"
SYNTAX_TOO_DEEP: Final = "syntax.too_deep"
CTE_RECURSIVE: Final = "cte.recursive"

# Tables and columns.
TABLE_SYSTEM_SCHEMA: Final = "table.system_schema"
TABLE_NOT_ALLOWED: Final = "table.not_allowed"
TABLE_UNQUALIFIED: Final = "table.unqualified"
TABLE_CATALOG: Final = "table.catalog"
TABLE_CLAUSE: Final = "table.clause"
TABLE_FUNCTION: Final = "table.function"
COLUMN_NOT_ALLOWED: Final = "column.not_allowed"
COLUMN_STAR: Final = "column.star"
COLUMN_UNKNOWN_SOURCE: Final = "column.unknown_source"
SCOPE_UNRESOLVED: Final = "scope.unresolved"
DATABASE_MISMATCH: Final = "database.mismatch"

# LIMIT.
LIMIT_MISSING: Final = "limit.missing"
LIMIT_TOO_LARGE: Final = "limit.too_large"
LIMIT_NOT_LITERAL: Final = "limit.not_literal"

# The regenerated SQL must parse back to itself.
CANONICAL_UNSTABLE: Final = "canonical.unstable"

# Anything else the validator did not expect.
VALIDATOR_INTERNAL: Final = "validator.internal"

# Executor-side decisions.
SIGNATURE_MISSING: Final = "signature.missing"
SIGNATURE_INVALID: Final = "signature.invalid"
POLICY_STALE: Final = "policy.stale"
POLICY_UNKNOWN_TENANT: Final = "policy.unknown_tenant"
REVALIDATION_FAILED: Final = "revalidation.failed"
REVALIDATION_CHANGED: Final = "revalidation.changed"
EXPLAIN_FULL_SCAN: Final = "explain.full_scan"
EXPLAIN_ROWS: Final = "explain.rows"
EXPLAIN_SORT: Final = "explain.sort"
EXPLAIN_ERROR: Final = "explain.error"
POOL_BUSY: Final = "pool.busy"
EXEC_KILLED: Final = "exec.killed"
EXEC_DB_ERROR: Final = "exec.db_error"
EXEC_EXPIRED: Final = "exec.expired"


class Rejection(Exception):
    """Raised inside the guard; turned into a rejected `Verdict` at its boundary."""

    def __init__(self, rule: str, detail: str, node: str | None = None) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail
        self.node = node
