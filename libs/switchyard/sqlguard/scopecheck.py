"""Tables and columns, resolved scope by scope the way MySQL resolves them.

sqlglot's scope analysis says which name in which FROM/JOIN is a CTE, a
derived table or a real table (a qualified `db.t` is always real, so a CTE
cannot shadow an allowed view into reading another schema). Every real table
must be an allowed view; every column must be allowed in the table it can
resolve to. Where MySQL could resolve an unqualified name to more than one
source (or to an outer query's), every candidate must allow it: the check
never guesses in the attacker's favour. Every `Table` and `Column` node of the
tree must be met by this walk, or the statement is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.optimizer.scope import Scope, ScopeType, traverse_scope, walk_in_scope

from switchyard.sqlguard import rules
from switchyard.sqlguard.policy import SYSTEM_SCHEMAS, AllowedTable, Policy
from switchyard.sqlguard.rules import Rejection


def describe(node: exp.Expr) -> str:
    try:
        text = node.sql(dialect="mysql")
    except Exception:  # a node that cannot render is still worth naming
        text = ""
    return f"{type(node).__name__}: {text[:120]}" if text else type(node).__name__


@dataclass
class Context:
    policy: Policy
    database: str | None
    allow_any_table: bool
    allowed: dict[tuple[str, str], AllowedTable] = field(init=False)
    # id(Table node) -> what it was checked against; None for a table in any-table mode
    real_tables: dict[int, AllowedTable | None] = field(default_factory=dict)
    tables_used: list[str] = field(default_factory=list)
    # Renames wait until every check ran: scopes key their sources by the names as
    # parsed, and renaming earlier would hide a source from the column checks.
    renames: list[tuple[exp.Table, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.allowed = self.policy.allowed


def check_tables_and_columns(root: exp.Expr, ctx: Context) -> list[str]:
    """Check (and qualify) every table, then every column; the tables read, as `db.t`."""
    scopes = traverse_scope(root)
    if not scopes:
        raise Rejection(rules.SCOPE_UNRESOLVED, "the statement has no query scope", describe(root))
    table_scope: dict[int, Scope] = {}
    for scope in scopes:
        for table in scope.tables:
            table_scope[id(table)] = scope
    for table in root.find_all(exp.Table):
        home = table_scope.get(id(table))
        if home is None:
            raise Rejection(
                rules.SCOPE_UNRESOLVED, "a table outside any query scope", describe(table)
            )
        if _is_cte_reference(table, home):
            continue
        _check_table(table, ctx)

    seen: set[int] = set()
    for scope in scopes:
        _check_scope_columns(scope, ctx, seen)
    for column in root.find_all(exp.Column):
        if id(column) not in seen:
            raise Rejection(
                rules.SCOPE_UNRESOLVED, "a column outside any query scope", describe(column)
            )
    for table, schema, name in ctx.renames:
        table.set("db", exp.to_identifier(schema))
        table.set("this", exp.to_identifier(name))
    return ctx.tables_used


def _is_cte_reference(table: exp.Table, scope: Scope) -> bool:
    if table.args.get("db") is not None:
        return False  # `db.name` is a real table even when a CTE is called `name`
    return isinstance(scope.sources.get(table.alias_or_name), Scope)


def _check_table(table: exp.Table, ctx: Context) -> None:
    name = table.name
    schema = table.text("db") or ctx.database
    if schema and schema.lower() in SYSTEM_SCHEMAS:
        raise Rejection(
            rules.TABLE_SYSTEM_SCHEMA, f"system schema {schema} is never readable", describe(table)
        )
    if ctx.allow_any_table:
        if schema and table.args.get("db") is None:
            ctx.renames.append((table, schema, name))
        ctx.real_tables[id(table)] = None
        ctx.tables_used.append(f"{schema}.{name}" if schema else name)
        return
    if not schema:
        raise Rejection(
            rules.TABLE_UNQUALIFIED,
            f"table {name} has no schema and the policy names no default database",
            describe(table),
        )
    allowed = ctx.allowed.get((schema.lower(), name.lower()))
    if allowed is None:
        raise Rejection(
            rules.TABLE_NOT_ALLOWED,
            f"{schema}.{name} is not one of the tenant's views",
            describe(table),
        )
    # The policy's spelling, fully qualified: the canonical SQL then means the same
    # thing on any connection, whatever its default database.
    ctx.renames.append((table, allowed.schema, allowed.table))
    ctx.real_tables[id(table)] = allowed
    ctx.tables_used.append(f"{allowed.schema}.{allowed.table}")


def _chain(scope: Scope) -> Iterator[Scope]:
    """The scopes an unqualified or qualified name may resolve in, innermost first.

    A derived table cannot see the query around it (LATERAL is refused), so its
    chain stops there; a subquery or CTE may be correlated, so theirs goes on out.
    """
    current: Scope | None = scope
    while current is not None:
        yield current
        if current.scope_type == ScopeType.DERIVED_TABLE:
            return
        current = current.parent


def _lookup(scope: Scope, qualifier: str) -> tuple[exp.Expr, exp.Table | Scope] | None:
    for s in _chain(scope):
        sources = s.selected_sources
        if qualifier in sources:
            return sources[qualifier]
        folded = [v for k, v in sources.items() if k.lower() == qualifier.lower()]
        if len(folded) == 1:
            return folded[0]
    return None


def output_names(source: Scope) -> set[str] | None:
    """Column names a derived table or CTE exposes; None when a star hides them."""
    if source.outer_columns:
        return {c.lower() for c in source.outer_columns}
    expression = source.expression
    if not isinstance(expression, exp.Query):
        return None
    names = expression.named_selects
    if "*" in names or any(isinstance(e, exp.Star) for e in expression.selects):
        return None
    return {n.lower() for n in names}


def _projection_aliases(scope: Scope) -> set[str]:
    expression = scope.expression
    if isinstance(expression, exp.Select):
        return {e.alias.lower() for e in expression.expressions if isinstance(e, exp.Alias)}
    return set()


def _in_order_by_of(column: exp.Column, scope: Scope) -> bool:
    order = column.find_ancestor(exp.Order, exp.Select, exp.SetOperation, exp.Window)
    return isinstance(order, exp.Order) and order.parent is scope.expression


def _check_scope_columns(scope: Scope, ctx: Context, seen: set[int]) -> None:
    for node in walk_in_scope(scope.expression):
        if isinstance(node, exp.Column):
            seen.add(id(node))
            if isinstance(node.this, exp.Star):
                _check_star(node, scope, ctx, node.table)
            elif node.table:
                _check_qualified(node, scope, ctx)
            else:
                _check_unqualified(node.name, node, scope, ctx)
        elif isinstance(node, exp.Star) and isinstance(node.parent, exp.Select):
            _check_star(node, scope, ctx, None)
        elif isinstance(node, exp.Join):
            for ident in node.args.get("using") or []:
                _check_unqualified(ident.name, ident, scope, ctx)


def _check_qualified(column: exp.Column, scope: Scope, ctx: Context) -> None:
    found = _lookup(scope, column.table)
    if found is None:
        raise Rejection(
            rules.COLUMN_UNKNOWN_SOURCE,
            f"{column.table} is not a table or alias of this query",
            describe(column),
        )
    _, source = found
    if isinstance(source, exp.Table):
        db = column.text("db")
        if db and db.lower() != (source.text("db") or ctx.database or "").lower():
            raise Rejection(
                rules.COLUMN_UNKNOWN_SOURCE,
                f"{db}.{column.table} is not a table of this query",
                describe(column),
            )
        allowed = ctx.real_tables.get(id(source))
        if allowed is not None and not allowed.allows(column.name):
            raise Rejection(
                rules.COLUMN_NOT_ALLOWED,
                f"column {column.name} of {allowed.schema}.{allowed.table} is not allowed",
                describe(column),
            )


def _check_unqualified(name: str, node: exp.Expr, scope: Scope, ctx: Context) -> None:
    if ctx.allow_any_table:
        return
    if isinstance(scope.expression, exp.SetOperation):
        return  # ORDER BY of a UNION names the union's own output columns
    lowered = name.lower()
    if (
        isinstance(node, exp.Column)
        and _in_order_by_of(node, scope)
        and lowered in _projection_aliases(scope)
    ):
        return  # MySQL resolves ORDER BY names to select aliases first
    exact = bool(ctx.policy.exact_columns)
    resolvable = False
    for s in _chain(scope):
        for _, source in s.selected_sources.values():
            if isinstance(source, Scope):
                names = output_names(source)
                resolvable = resolvable or names is None or lowered in names
                continue
            allowed = ctx.real_tables.get(id(source))
            if allowed is None:
                continue
            if allowed.allows(name):
                resolvable = True
            elif not exact:
                # The view may hold columns the policy does not list; an unqualified
                # name could resolve to one of them.
                raise Rejection(
                    rules.COLUMN_NOT_ALLOWED,
                    f"column {name} is not allowed in {allowed.schema}.{allowed.table}, "
                    "which this unqualified name could reach; qualify it",
                    describe(node),
                )
    if exact and not resolvable and lowered not in _projection_aliases(scope):
        raise Rejection(
            rules.COLUMN_NOT_ALLOWED,
            f"no allowed table of this query has a column {name}",
            describe(node),
        )


def _check_star(node: exp.Expr, scope: Scope, ctx: Context, qualifier: str | None) -> None:
    if ctx.allow_any_table:
        return
    if qualifier:
        found = _lookup(scope, qualifier)
        if found is None:
            raise Rejection(
                rules.COLUMN_UNKNOWN_SOURCE,
                f"{qualifier} is not a table or alias of this query",
                describe(node),
            )
        sources = [found[1]]
    else:
        sources = [source for _, source in scope.selected_sources.values()]
    for source in sources:
        if isinstance(source, Scope):
            continue
        allowed = ctx.real_tables.get(id(source))
        # With exact column lists the view holds exactly the allowed columns,
        # so a star cannot reach anything else.
        if allowed is not None and allowed.columns is not None and not ctx.policy.exact_columns:
            raise Rejection(
                rules.COLUMN_STAR,
                f"* over {allowed.schema}.{allowed.table} would include columns the policy "
                "does not allow; name the columns",
                describe(node),
            )
