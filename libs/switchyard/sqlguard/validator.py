"""`validate(sql, policy)`: the SQL guard as one pure function that fails closed.

Steps: raw-text checks and tokens (`prescan`), a MySQL parse (the dialect is
always explicit), exactly one statement whose root is a query, the allowlist
walk (`treecheck`), select aliases in GROUP BY/HAVING/ORDER BY replaced by their
expressions where MySQL would resolve them so (`aliases`), tables and columns scope by
scope (`scopecheck`), the
outer LIMIT (`limits`), then the canonical SQL regenerated without comments,
every identifier quoted, and re-parsed to make sure it means itself. Any
exception on the way, including `RecursionError`, is a rejection.
"""

from __future__ import annotations

import contextlib
import logging
import re

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, OptimizeError, ParseError, TokenError, UnsupportedError

from switchyard.logging import get_logger
from switchyard.sqlguard import rules
from switchyard.sqlguard.aliases import resolve_aliases
from switchyard.sqlguard.limits import apply_limit
from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.prescan import tokenize
from switchyard.sqlguard.rules import Rejection
from switchyard.sqlguard.scopecheck import Context, check_tables_and_columns, describe
from switchyard.sqlguard.treecheck import check_depth, check_tree
from switchyard.sqlguard.verdict import Verdict

log = get_logger(__name__)
# sqlglot warns (e.g. "falling back to parsing as a Command") on stderr; we reject those anyway.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

DIALECT = Dialect.get_or_raise("mysql")
_QUERY_ROOTS = (exp.Select, exp.Union, exp.Intersect, exp.Except)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
CHECKS = (
    "charset", "length", "single_statement", "query_root", "allowlist", "tables",
    "columns", "limit", "canonical",
)  # fmt: skip


def _parse(sql: str, policy: Policy) -> exp.Expr:
    tokens = tokenize(sql, policy, DIALECT)
    statements = [s for s in DIALECT.parser(error_level=ErrorLevel.RAISE).parse(tokens, sql) if s]
    if not statements:
        raise Rejection(rules.INPUT_EMPTY, "no statement")
    if len(statements) > 1:
        raise Rejection(
            rules.STATEMENT_MULTIPLE,
            f"{len(statements)} statements; exactly one is allowed",
            describe(statements[1]),
        )
    root: exp.Expr = statements[0]
    # `(SELECT ...)` is the same query; with its own ORDER BY/LIMIT outside it is not.
    while isinstance(root, exp.Subquery) and set(k for k, v in root.args.items() if v) == {"this"}:
        root = root.this
    if not isinstance(root, _QUERY_ROOTS):
        raise Rejection(
            rules.STATEMENT_TYPE,
            f"{type(root).__name__} statements are not allowed; only SELECT queries",
            describe(root),
        )
    root.pop()  # detach from a removed Subquery wrapper
    return root


def _drop_dual(root: exp.Expr) -> None:
    """`FROM DUAL` is no table; quoting it as an identifier would make it one."""
    for select in list(root.find_all(exp.Select)):
        source = select.args.get("from_")
        table = source.this if source is not None else None
        if (
            isinstance(table, exp.Table)
            and table.name.upper() == "DUAL"
            and not table.args.get("db")
            and not table.this.args.get("quoted")
            and not table.args.get("alias")
            and not select.args.get("joins")
        ):
            select.set("from_", None)


def render(root: exp.Expr) -> str:
    return root.sql(
        dialect=DIALECT,
        comments=False,
        identify=True,
        unsupported_level=ErrorLevel.RAISE,
    )


def _validate(
    sql: str,
    policy: Policy,
    database: str | None,
    allow_any_table: bool,
    fixpoint: bool,
    version: str,
) -> Verdict:
    if database and policy.database and database.lower() != policy.database.lower():
        raise Rejection(
            rules.DATABASE_MISMATCH,
            f"request database {database} is not the policy's {policy.database}",
        )
    root = _parse(sql, policy)
    check_depth(root, policy.max_depth)
    check_tree(root, policy)
    _drop_dual(root)
    resolve_aliases(root, policy, database)
    ctx = Context(policy, policy.database or database, allow_any_table)
    tables = check_tables_and_columns(root, ctx)
    action = apply_limit(root, policy)
    canonical = render(root)
    if fixpoint:
        again = DIALECT.parse(canonical)
        if len(again) != 1 or again[0] is None or render(again[0]) != canonical:
            raise Rejection(
                rules.CANONICAL_UNSTABLE, "the regenerated SQL does not parse back to itself"
            )
    return Verdict(
        ok=True,
        sql=canonical,
        policy_version=version,
        checks=CHECKS,
        tables=tuple(dict.fromkeys(tables)),
        limit_action=action,
    )


def validate(
    sql: str,
    policy: Policy,
    *,
    database: str | None = None,
    allow_any_table: bool = False,
    fixpoint: bool = True,
) -> Verdict:
    """Allowed (with the canonical SQL to run) or rejected (with a rule id); never raises."""
    version = policy.policy_version
    try:
        return _validate(sql, policy, database, allow_any_table, fixpoint, version)
    except Rejection as r:
        return Verdict(False, rule=r.rule, detail=r.detail, node=r.node, policy_version=version)
    except RecursionError:
        return Verdict(
            False,
            rule=rules.PARSE_RECURSION,
            detail="statement too deeply nested to parse",
            policy_version=version,
        )
    except (ParseError, TokenError) as exc:
        detail = _ANSI.sub("", str(exc)).replace("\n", " ")[:300]
        return Verdict(False, rule=rules.PARSE_ERROR, detail=detail, policy_version=version)
    except (OptimizeError, UnsupportedError) as exc:
        return Verdict(
            False, rule=rules.SCOPE_UNRESOLVED, detail=str(exc)[:300], policy_version=version
        )
    except Exception as exc:  # fail closed: a surprise is a rejection, and worth a log line
        with contextlib.suppress(Exception):  # not even a broken log sink may make this raise
            log.warning("sqlguard.internal_error", error=f"{type(exc).__name__}: {exc}"[:300])
        return Verdict(
            False,
            rule=rules.VALIDATOR_INTERNAL,
            detail=f"{type(exc).__name__}: {str(exc)[:200]}",
            policy_version=version,
        )
