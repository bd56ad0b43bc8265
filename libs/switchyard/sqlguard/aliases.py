"""Select aliases in GROUP BY, HAVING and ORDER BY, resolved as MySQL resolves them.

MySQL looks an unqualified name up in different places per clause (MySQL 8.4 manual,
"Problems with Column Aliases" and SELECT: "MySQL resolves an unqualified column or
alias reference in an ORDER BY clause by searching in the select_expr values, then in
the columns of the tables in the FROM clause. For GROUP BY or HAVING clauses, it
searches the FROM clause before searching in the select_expr values"; MariaDB does the
same):

- ORDER BY: a select alias wins over a table column of the same name;
- GROUP BY and HAVING: a column of a FROM source wins; the alias only when no source
  has that column.

Where the alias wins, the reference is replaced by a copy of the alias's expression,
before any table or column is checked: the column allowlist then judges the expression
itself, unchanged, and the canonical SQL names no alias a hidden column could answer
to. Whether a source "has" a column is decided from the policy, never guessed in the
query's favour:

- a view whose columns are all allowed (`"*"`) may have any column: the name is left as
  written, and MySQL resolves it (whatever it reaches is allowed);
- a listed column: the column wins;
- a name the policy does not list: with `exact_columns` the view has no such column, so
  the alias wins; without, the view may hold a hidden column of that name, which MySQL
  would prefer in GROUP BY/HAVING. The alias's expression is used instead, so that
  column is unreachable (the statement means what its author wrote, not what a hidden
  column would make of it);
- a derived table or CTE: its output names; a `*` in it hides them, so the name is left
  for the column checks to judge.

In GROUP BY and ORDER BY only a whole item is an alias reference (`ORDER BY n`, not
`ORDER BY n + 1`); in HAVING any name outside an aggregate's argument. A name inside a
subquery of those clauses belongs to that subquery's own scope, and a window's ORDER BY
(`OVER (ORDER BY ...)`) never sees select aliases: neither is touched. So validating
the canonical SQL again changes nothing (the executor does exactly that).
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope, walk_in_scope

from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.scopecheck import output_names

_CLAUSES = ("group", "having", "order")


def resolve_aliases(root: exp.Expr, policy: Policy, database: str | None) -> None:
    """Rewrite, in place, every alias reference MySQL would resolve to a select alias."""
    for scope in traverse_scope(root):
        select = scope.expression
        if not isinstance(select, exp.Select):
            continue  # a UNION's ORDER BY names the union's own output columns
        named = [e for e in select.expressions if isinstance(e, exp.Alias)]
        spelled = [e.alias.lower() for e in named]
        # An alias given twice is ambiguous to MySQL too: left for the database to refuse.
        aliases = {a: e.this for a, e in zip(spelled, named, strict=True) if spelled.count(a) == 1}
        if not aliases:
            continue
        for clause in _CLAUSES:
            node = select.args.get(clause)
            if node is None:
                continue
            for column in _alias_references(clause, node, aliases):
                name = column.name.lower()
                if clause != "order" and _source_may_have(scope, name, policy, database):
                    continue
                if clause == "order" and _names_an_alias(aliases[name], aliases):
                    # `a AS x, a + 0 AS a ... ORDER BY x`: `ORDER BY a` would be taken
                    # for the other alias. ORDER BY resolves `x` to its alias anyway.
                    continue
                column.replace(aliases[name].copy())


def _alias_references(
    clause: str, node: exp.Expr, aliases: dict[str, exp.Expr]
) -> list[exp.Column]:
    """The columns of `clause` that may name a select alias.

    GROUP BY and ORDER BY: a whole item (`ORDER BY n`), the form MySQL documents; a
    name inside an expression there is left as written, for the column checks to judge.
    HAVING: any unqualified name, except inside an aggregate's argument, which is
    evaluated over the rows (`SUM(n)` sums the column). Never inside a subquery (its
    own scope) or a window (`OVER (ORDER BY n)` sees no select alias). These rules also
    make the rewrite idempotent: the expression put in place of `n` is never taken for
    `n` again when the canonical SQL is validated once more.
    """
    if clause == "having":
        candidates = [
            c for c in walk_in_scope(node)
            if isinstance(c, exp.Column)
            and c.find_ancestor(exp.AggFunc, exp.Window, exp.Having) is node
        ]  # fmt: skip
    else:
        items = node.expressions
        candidates = [i.this if isinstance(i, exp.Ordered) else i for i in items]
    return [
        c
        for c in candidates
        if isinstance(c, exp.Column)
        and not c.table
        and isinstance(c.this, exp.Identifier)
        and c.name.lower() in aliases
    ]


def _names_an_alias(expression: exp.Expr, aliases: dict[str, exp.Expr]) -> bool:
    return (
        isinstance(expression, exp.Column)
        and not expression.table
        and expression.name.lower() in aliases
    )


def _source_may_have(scope: Scope, name: str, policy: Policy, database: str | None) -> bool:
    """Whether some FROM source of `scope` has, or may have, a column `name`."""
    allowed = policy.allowed
    for _, source in scope.selected_sources.values():
        if isinstance(source, Scope):
            names = output_names(source)
            if names is None or name in names:
                return True
            continue
        if not isinstance(source, exp.Table):
            return True  # not a table we can reason about: leave the name as written
        schema = (source.text("db") or policy.database or database or "").lower()
        entry = allowed.get((schema, source.name.lower()))
        if entry is None or entry.columns is None:
            return True  # unknown to the policy (refused later) or every column allowed
        if name in entry.columns:
            return True
        # Not listed: with exact columns the view has none such; without, it may, and
        # MySQL would take it - so the alias's expression is used, never that column.
    return False
