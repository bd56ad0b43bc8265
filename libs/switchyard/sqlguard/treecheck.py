"""Every node of the tree against the allowlist, plus the few per-node rules."""

from __future__ import annotations

from sqlglot import exp

from switchyard.sqlguard import rules
from switchyard.sqlguard.allowlist import (
    ANONYMOUS_FUNCTIONS,
    DANGEROUS_FUNCTIONS,
    FUNCTIONS,
    STRUCTURE,
    function_name,
    var_allowed,
)
from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.rules import Rejection
from switchyard.sqlguard.scopecheck import describe

# Select arguments that may be set; anything else (INTO, FOR UPDATE, hints,
# SQL_CALC_FOUND_ROWS and friends, dialect extras) is refused.
_SELECT_ARGS = frozenset(
    {
        "expressions", "from_", "joins", "where", "group", "having", "order", "limit",
        "offset", "with_", "distinct", "windows",
    }
)  # fmt: skip
_SELECT_ARG_RULES = {
    "into": rules.SYNTAX_INTO,
    "locks": rules.SYNTAX_LOCK,
    "hint": rules.SYNTAX_HINT,
    "operation_modifiers": rules.SYNTAX_MODIFIER,
}
_TABLE_ARGS = frozenset({"this", "db", "alias"})
_JOIN_KINDS = frozenset({"", "INNER", "CROSS", "OUTER", "STRAIGHT_JOIN"})
_NODE_RULES: dict[type[exp.Expr], str] = {
    exp.Into: rules.SYNTAX_INTO,
    exp.Lock: rules.SYNTAX_LOCK,
    exp.Hint: rules.SYNTAX_HINT,
    exp.Parameter: rules.SYNTAX_VARIABLE,
    exp.SessionParameter: rules.SYNTAX_VARIABLE,
    exp.PropertyEQ: rules.SYNTAX_VARIABLE,
    exp.Placeholder: rules.SYNTAX_PLACEHOLDER,
}
# Where a bare `*` is meaningful: `SELECT *`, `t.*`, `COUNT(*)`.
_STAR_PARENTS = (exp.Select, exp.Column, exp.Count)


def _set_args(node: exp.Expr) -> set[str]:
    return {k for k, v in node.args.items() if v is not None and v != [] and v is not False}


def check_depth(root: exp.Expr, limit: int) -> None:
    stack: list[tuple[exp.Expr, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise Rejection(
                rules.SYNTAX_TOO_DEEP, f"expression nested deeper than {limit}", describe(node)
            )
        stack.extend((child, depth + 1) for child in node.iter_expressions())


def check_tree(root: exp.Expr, policy: Policy) -> None:
    for node in root.walk():
        kind = type(node)
        if kind in STRUCTURE or kind in FUNCTIONS:
            _check_allowed_node(node, policy)
            continue
        if isinstance(node, exp.Anonymous):
            name = function_name(node)
            if name in ANONYMOUS_FUNCTIONS and name not in DANGEROUS_FUNCTIONS:
                continue
            why = "is never allowed" if name in DANGEROUS_FUNCTIONS else "is not on the allowlist"
            raise Rejection(rules.SYNTAX_FUNCTION, f"function {name} {why}", describe(node))
        rule = _NODE_RULES.get(kind)
        if rule is None and isinstance(node, exp.Func):
            raise Rejection(
                rules.SYNTAX_FUNCTION,
                f"function {function_name(node)} is not on the allowlist",
                describe(node),
            )
        raise Rejection(
            rule or rules.SYNTAX_NODE, f"{kind.__name__} is not allowed here", describe(node)
        )


def _check_allowed_node(node: exp.Expr, policy: Policy) -> None:
    if isinstance(node, exp.Select):
        for arg in _set_args(node) - _SELECT_ARGS:
            rule = _SELECT_ARG_RULES.get(arg, rules.SYNTAX_NODE)
            raise Rejection(rule, f"SELECT clause {arg!r} is not allowed", describe(node))
    elif isinstance(node, exp.Var):
        if not var_allowed(node):
            rule = (
                rules.SYNTAX_MODIFIER
                if node.arg_key == "operation_modifiers"
                else rules.SYNTAX_KEYWORD
            )
            raise Rejection(rule, f"keyword {node.name} is not allowed here", describe(node))
    elif isinstance(node, exp.Star):
        if not isinstance(node.parent, _STAR_PARENTS):
            raise Rejection(
                rules.SYNTAX_STAR, "* is not allowed here", describe(node.parent or node)
            )
    elif isinstance(node, exp.Join):
        if node.args.get("method"):
            rule = (
                rules.SYNTAX_NATURAL_JOIN
                if str(node.args["method"]).upper() == "NATURAL"
                else rules.SYNTAX_NODE
            )
            raise Rejection(rule, f"{node.args['method']} joins are not allowed", describe(node))
        if str(node.args.get("kind") or "").upper() not in _JOIN_KINDS:
            raise Rejection(rules.SYNTAX_NODE, "unsupported join kind", describe(node))
    elif isinstance(node, exp.Table):
        if not isinstance(node.this, exp.Identifier):
            raise Rejection(rules.TABLE_FUNCTION, "table functions are not allowed", describe(node))
        if node.args.get("catalog") is not None:
            raise Rejection(
                rules.TABLE_CATALOG, "three-part table names are not allowed", describe(node)
            )
        extra = _set_args(node) - _TABLE_ARGS
        if extra:
            raise Rejection(
                rules.TABLE_CLAUSE,
                f"table clauses {sorted(extra)} (index hints, partitions, ...) are not allowed",
                describe(node),
            )
    elif isinstance(node, exp.Column):
        if node.args.get("catalog") is not None:
            raise Rejection(
                rules.TABLE_CATALOG, "four-part column names are not allowed", describe(node)
            )
    elif isinstance(node, exp.With):
        if node.args.get("recursive") and not policy.allow_recursive_cte:
            raise Rejection(rules.CTE_RECURSIVE, "recursive CTEs are not allowed", describe(node))
    elif isinstance(node, exp.Distinct):
        if node.args.get("on") is not None:
            raise Rejection(rules.SYNTAX_NODE, "DISTINCT ON is not MySQL", describe(node))
    elif isinstance(node, exp.Interval) and node.args.get("unit") is None:
        raise Rejection(rules.SYNTAX_NODE, "INTERVAL needs a unit", describe(node))
