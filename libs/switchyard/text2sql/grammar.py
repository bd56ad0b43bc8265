"""A GBNF grammar of the SELECT statements a tenant's policy allows.

Decoding under it, a model can only write one SELECT over the tenant's views
and their allowed columns: syntax errors, invented tables or columns, other
statements, comments, UNION and stacked statements cannot be sampled. The
validator still judges every statement (it is the security boundary); the
grammar only makes its rejections rare.

The language is a small analytics subset, in single spaces only:

    SELECT [DISTINCT] item, ... FROM view [a JOIN view b ON a.k = b.k]
    [WHERE cond] [GROUP BY col, ... [HAVING cond]] [ORDER BY expr [ASC|DESC], ...]
    LIMIT 1..1000

Items are `*`, `COUNT(*)`, `COUNT(DISTINCT col)`, `SUM|AVG|MIN|MAX(expr)`,
columns, `+ - * /` with numbers, `ROUND(expr, n)`, `DATE(col)`,
`DATE_SUB(x, INTERVAL n DAY)`, each optionally `AS alias`. Conditions compare
with numbers, 'strings', 'YYYY-MM-DD' dates and `(SELECT MAX|MIN(col) FROM
view)` (the "latest day" convention), and use BETWEEN, IN, IS [NOT] NULL,
[NOT] LIKE, AND, OR, NOT and one level of parentheses. Nesting and repetition
are bounded, so no sentence can trip the validator's size and depth limits.

A grammar cannot remember which view the FROM clause will name, and the select
list comes first. So the grammar is a union of scopes, each spelling out its own
views' columns: a single-view scope (`col` or `view.col`), and a join scope per
pair of views sharing a join key (`a.col`, `b.col` with the views' aliases fixed
to `a` and `b`, one JOIN, the pair in name order). Every sentence therefore reads
only columns its own FROM clause has, which is what the validator demands under
`exact_columns`. Columns are judged per scope only: which columns make sense
together (GROUP BY rules, types) stays the database's and the validator's call.

Size matters: every scope is alive until the FROM clause, and llama.cpp's grammar
sampler slows down with each (measured on SmolLM2-135M: two views with their join
decode at ~40 tokens/s, three views with three joins at ~2 tokens/s). All 14 demo
views with the default join keys make a ~95 KB grammar, over the 64 KiB a
`GrammarConstraint` carries. Pass the views a question needs, and `join_keys=()`
when it needs no join.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.validator import DIALECT

# Columns that commonly link two views; a join scope exists per pair sharing one.
DEFAULT_JOIN_KEYS = ("player_id", "server_id", "order_id", "day", "region_id", "tier_id")
MAX_LIMIT = 1000

# Aliases are `[a-z_]{1,30}` except the keywords sqlglot's MySQL parser refuses
# after AS (every other keyword parses as a name there, and the canonical SQL
# quotes it). tests/unit/test_sql_grammar.py checks this list against sqlglot.
ALIAS_MAX = 30
ALIAS_CHARS = "abcdefghijklmnopqrstuvwxyz_"
ALIAS_REFUSED = frozenset({"mod", "not", "select"})

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")

# Shared terminals, independent of the policy.
_COMMON = (
    'op ::= " + " | " - " | " * " | " / "',
    'cmp ::= " = " | " <> " | " < " | " <= " | " > " | " >= "',
    'num ::= [0-9]{1,9} ("." [0-9]{1,4})?',
    "int ::= [1-9] [0-9]{0,3}",
    'limit ::= [1-9] [0-9]{0,2} | "1000"',
    'str ::= "\'" [A-Za-z0-9 _.,:%/-]{0,40} "\'"',
    'date ::= "\'" [12] [0-9]{3} "-" ("0" [1-9] | "1" [0-2]) "-" '
    '("0" [1-9] | [12] [0-9] | "3" [01]) "\'"',
    "lit ::= num | str",
    'lits ::= lit (", " lit){0,9}',
    'dir ::= " ASC" | " DESC"',
    'agg ::= "SUM(" | "AVG(" | "MIN(" | "MAX("',
    'ext ::= "MAX(" | "MIN("',
)


@dataclass(frozen=True)
class _View:
    sql: str  # how a statement names it: `players`, or `schema.players` off the default
    name: str  # unqualified, as `views` names it
    columns: tuple[str, ...]  # sorted, as written in SQL
    listed: bool  # the policy lists its columns (rather than "*")


def select_grammar(
    policy: Policy,
    views: Sequence[str] | None = None,
    *,
    columns: Mapping[str, Sequence[str]] | None = None,
    join_keys: Sequence[str] = DEFAULT_JOIN_KEYS,
) -> str:
    """The GBNF grammar (root rule `root`) of the SELECTs `policy` allows.

    `views` keeps only those views (unqualified names; a name the policy lacks is
    a `ValueError`). A view the policy allows as `"*"` has no column list to
    enumerate: its columns come from `columns` (keyed by unqualified or
    `schema.view` name), and without an entry there the view is left out.
    `join_keys` are the column names a join may match on; empty means no joins.
    Views outside `policy.database` are named `schema.view`; the rest unqualified.
    Raises `ValueError` when no view remains.
    """
    chosen = _views(policy, views, columns or {})
    if not chosen:
        raise ValueError("no view of the policy has known columns to build a grammar from")
    # `*` reads every column of the view; the validator allows it only where the
    # allowed columns are the whole view.
    exact = policy.exact_columns
    lines: list[str] = []
    roots: list[str] = []
    for i, view in enumerate(chosen):
        lines.append(f"c{i} ::= " + _alternatives(view.columns))
    for i, view in enumerate(chosen):
        refs = [f"c{i}"] + ([_lit(view.sql + ".") + f" c{i}"] if "." not in view.sql else [])
        subs = [(view, f"c{i}")]
        lines += _scope(f"s{i}", _lit(view.sql), refs, subs, exact or not view.listed)
        roots.append(f"s{i}")
    keys = {k.lower() for k in join_keys}
    for i, left in enumerate(chosen):
        for j in range(i + 1, len(chosen)):
            right = chosen[j]
            on = sorted(set(left.columns) & set(right.columns), key=str.lower)
            on = [k for k in on if k.strip("`").lower() in keys]
            if not on:
                continue
            name = f"j{i}-{j}"
            source = (
                f"{_lit(left.sql + ' a JOIN ' + right.sql + ' b ON ')} ("
                + " | ".join(_lit(f"a.{k} = b.{k}") for k in on)
                + ")"
            )
            refs = [f'"a." c{i}', f'"b." c{j}']
            subs = []
            for n, view, other in ((i, left, right), (j, right, left)):
                # An unqualified name in a subquery may also reach the outer views;
                # without exact columns each of them must allow it too.
                shared = view.columns if exact else _common(view, other)
                if shared == view.columns:
                    subs.append((view, f"c{n}"))
                elif shared:
                    lines.append(f"{name}-c{n} ::= " + _alternatives(shared))
                    subs.append((view, f"{name}-c{n}"))
            star = exact or not (left.listed or right.listed)
            lines += _scope(name, source, refs, subs, star)
            roots.append(name)
    head = ["root ::= " + " | ".join(roots)]
    return "\n".join(head + lines + list(_COMMON) + _alias_rules()) + "\n"


def _views(
    policy: Policy, names: Sequence[str] | None, columns: Mapping[str, Sequence[str]]
) -> list[_View]:
    default = (policy.database or "").lower()
    wanted = None if names is None else {n.lower() for n in names}
    out: list[_View] = []
    seen: set[str] = set()
    for qualified, allowed in policy.tables.items():
        schema, name = qualified.split(".", 1)
        seen.add(name.lower())
        if wanted is not None and name.lower() not in wanted:
            continue
        if allowed == "*":
            cols = columns.get(qualified, columns.get(name))
            if cols is None:
                continue  # nothing to enumerate: leave the view out
            for c in cols:
                if not _NAME.match(c):
                    raise ValueError(f"{qualified}: not a column name: {c!r}")
        else:
            cols = allowed
        sql = _ident(name) if schema.lower() == default else f"{_ident(schema)}.{_ident(name)}"
        out.append(
            _View(
                sql, name, tuple(sorted({_ident(c) for c in cols}, key=str.lower)), allowed != "*"
            )
        )
    missing = sorted((wanted or set()) - seen)
    if missing:
        raise ValueError(f"not views of the policy: {', '.join(missing)}")
    return sorted(out, key=lambda v: (v.sql.lower(), v.sql))


def _common(view: _View, other: _View) -> tuple[str, ...]:
    if not other.listed:
        return view.columns
    return tuple(c for c in view.columns if c in set(other.columns))


def _scope(
    p: str, source: str, refs: Sequence[str], subs: Sequence[tuple[_View, str]], star: bool
) -> list[str]:
    """The rules of one scope: a FROM clause and the column references it can resolve."""
    # (S608: these are grammar rules, not SQL handed to a database)
    sub = " | ".join(f'"(SELECT " ext {rule} ") FROM {_esc(v.sql)})"' for v, rule in subs)  # noqa: S608
    items = f'{p}-item (", " {p}-item){{0,7}}'
    cond1 = f'("NOT "? {p}-pred)'
    with_sub = f" | {p}-sub" if sub else ""
    return [
        f'{p} ::= "SELECT " "DISTINCT "? {p}-items " FROM " {source} (" WHERE " {p}-cond)? '  # noqa: S608
        f'(" GROUP BY " {p}-ref (", " {p}-ref){{0,3}} (" HAVING " {p}-hcond)?)? '
        f'(" ORDER BY " {p}-ord (", " {p}-ord){{0,2}})? " LIMIT " limit',
        f"{p}-items ::= " + (f'"*" | {items}' if star else items),
        f'{p}-item ::= {p}-mexpr (" AS " alias)?',
        f"{p}-ref ::= " + " | ".join(refs),
        *([f"{p}-sub ::= {sub}"] if sub else []),
        f"{p}-val ::= {p}-ref | num",
        f"{p}-date ::= {p}-ref | date{with_sub}",
        f'{p}-sfn ::= "DATE(" {p}-ref ")" | "DATE_SUB(" {p}-date ", INTERVAL " int " DAY)"',
        f"{p}-sterm ::= {p}-val | {p}-sfn",
        f"{p}-sarith ::= {p}-sterm (op {p}-sterm){{0,2}}",
        f'{p}-agg ::= "COUNT(*)" | "COUNT(DISTINCT " {p}-ref ")" | agg {p}-sarith ")"',
        f"{p}-mterm ::= {p}-agg | {p}-sterm",
        f"{p}-marith ::= {p}-mterm (op {p}-mterm){{0,2}}",
        f'{p}-mexpr ::= {p}-marith | "ROUND(" {p}-marith ", " [0-4] ")"',
        f"{p}-pred ::= {p}-sarith cmp ({p}-sarith | str{with_sub})"
        f' | {p}-sarith " BETWEEN " {p}-bval " AND " {p}-bval'
        f' | {p}-ref " IN (" lits ")" | {p}-ref " NOT IN (" lits ")"'
        f' | {p}-ref " IS NULL" | {p}-ref " IS NOT NULL"'
        f' | {p}-ref " LIKE " str | {p}-ref " NOT LIKE " str',
        f"{p}-bval ::= {p}-sterm | str",
        f'{p}-cond ::= {p}-conj (" OR " {p}-conj){{0,3}}',
        f'{p}-conj ::= {p}-neg (" AND " {p}-neg){{0,4}}',
        f'{p}-neg ::= "NOT "? {p}-catom',
        f'{p}-catom ::= {p}-pred | "(" {p}-cond1 ")"',
        f'{p}-cond1 ::= {p}-conj1 (" OR " {p}-conj1){{0,3}}',
        f'{p}-conj1 ::= {cond1} (" AND " {cond1}){{0,4}}',
        f'{p}-hcond ::= {p}-hpred ((" AND " | " OR ") {p}-hpred){{0,2}}',
        f"{p}-hpred ::= {p}-marith cmp ({p}-marith | num)",
        f"{p}-ord ::= {p}-marith dir?",
    ]


def _alias_rules() -> list[str]:
    """`alias`: `[a-z_]{1,ALIAS_MAX}` minus `ALIAS_REFUSED`, via a trie of the refused words.

    Rule `alias-<prefix>` matches what may follow a prefix of a refused word: the
    next letter of a refused word leads on down the trie, any other letter frees the
    rest, and the prefix may end there unless it is itself refused.
    """
    prefixes = sorted({w[:n] for w in ALIAS_REFUSED for n in range(len(w))})
    rules: list[str] = []
    for prefix in prefixes:
        nexts = sorted({w[len(prefix)] for w in ALIAS_REFUSED if w.startswith(prefix)})
        alts: list[str] = []
        for ch in nexts:
            longer = prefix + ch
            if longer in prefixes:  # a proper prefix of a refused word: more trie
                tail = f"alias-{longer}" + ("" if longer in ALIAS_REFUSED else "?")
            else:  # a refused word itself (no refused word extends it): must go on
                tail = _free(len(longer), at_least_one=True)
            alts.append(f'"{ch}" {tail}'.rstrip())
        others = "".join(c for c in ALIAS_CHARS if c not in nexts)
        rest = ALIAS_MAX - len(prefix) - 1
        alts.append(f"[{others}]" + (f" [{ALIAS_CHARS}]{{0,{rest}}}" if rest > 0 else ""))
        name = "alias" if not prefix else f"alias-{prefix}"
        rules.append(f"{name} ::= " + " | ".join(alts))
    return rules


def _free(length: int, *, at_least_one: bool) -> str:
    rest = ALIAS_MAX - length
    low = 1 if at_least_one else 0
    return f"[{ALIAS_CHARS}]{{{low},{rest}}}"


def _ident(name: str) -> str:
    """A name as SQL must spell it: bare when plain, else in backticks."""
    if _PLAIN.match(name) and name.upper() not in DIALECT.tokenizer_class.KEYWORDS:
        return name
    return f"`{name}`"


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _lit(text: str) -> str:
    return f'"{_esc(text)}"'


def _alternatives(words: Iterable[str]) -> str:
    return " | ".join(_lit(w) for w in words)
