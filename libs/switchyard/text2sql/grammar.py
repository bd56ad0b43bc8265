"""A GBNF grammar of the SELECT statements a tenant's policy allows.

Decoding under it, a model can only write one SELECT over the grammar's views and
their allowed columns: syntax errors, invented tables or columns, other statements,
comments, UNION and stacked statements cannot be sampled. The validator still judges
every statement (it is the security boundary); the grammar only makes its rejections
rare.

The language is a small analytics subset, in single spaces only:

    SELECT [DISTINCT] item, ... FROM view [JOIN view ON key [AND key ...] [JOIN view ON ...]]
    [WHERE cond] [GROUP BY col, ... [HAVING cond]] [ORDER BY expr [ASC|DESC], ...]
    LIMIT 1..1000

Items are `*`, `COUNT(*)`, `COUNT(DISTINCT col)`, `SUM|AVG|MIN|MAX(expr)`,
columns, `+ - * /` with numbers, `ROUND(expr, n)`, `DATE(col)`,
`DATE_SUB(x, INTERVAL n DAY)`, each optionally `AS alias`. Conditions compare
with numbers, 'strings', 'YYYY-MM-DD' dates and `(SELECT MAX|MIN(col) FROM view)`
over the grammar's views and `subquery_views` (the "latest day" convention), and
use BETWEEN, IN, IS [NOT] NULL, [NOT] LIKE, AND, OR, NOT and one level of
parentheses. Nesting and repetition are bounded and no rule recurses.

Joins: a statement reads one view, or two or three joined in a chain (`a JOIN b ON
a.k = b.k JOIN c ON b.j = c.j`, in any order that joins each view to one before it),
each ON matching one or more declared join keys (`join_keys`) the two views share.
Views have no aliases: in a join every column is qualified by its view's name
(`players.level`); a statement of one view may use bare names too. A scope is a set
of views one FROM may read: each view, each pair sharing a key, each three linked by
two such pairs (`join_scopes`).

The select list comes before FROM, and a grammar cannot look ahead. One grammar per
scope, united (as this module used to build), keeps every scope alive until FROM:
its size grows with the scopes (pairs ~n^2, chains ~n^3), and so does the work of
llama.cpp's sampler, which tries every vocabulary token against every live rule
position. Instead:

- expressions are written once per view and spelling (rules `u<i>-*` bare names,
  `q<i>-*` qualified), not per scope. Each rule named after a view holds at least one
  of its columns, so a select item belongs to exactly one view, or (rules `z-*`:
  numbers, COUNT(*), subqueries) to none;
- the select list carries the views it has read in its rule name (`lq0-2`: qualified
  columns of views 0 and 2 so far, `lu1`: bare columns of view 1) and FROM may name
  only a scope holding all of them (`lu<i>`: view i alone). States only grow, so the
  rules stay acyclic. Before FROM, what is alive grows with the views, not the scopes;
- after FROM one scope is left: its WHERE, GROUP BY, HAVING and ORDER BY rules
  (`t<scope>-*`) are a few short lines over the per-view expressions.

So every sentence reads only columns its own FROM sources have, what the validator
demands under `exact_columns`. The price: a select item reads one view, so arithmetic
across views (`SUM(orders.x) / COUNT(players.y)`) is not in the select list (HAVING and
ORDER BY may compare views). Columns are judged per scope only: which columns make
sense together (GROUP BY rules, types) stays the database's and the validator's call.

Measured by `sy bench sql-grammar` (bench/sqlgrammar.py) on the demo schema,
SmolLM2-135M Q4_1, llama-cpp-python 0.3.36, 2 threads on a 2-core machine lightly
busy with other work. The largest grammar of n demo views, and its build time:

    views        1      2       3       4       5
    bytes    4,387  7,765  13,637  23,240  37,596
    build ms  0.13   0.23    0.41    0.78    0.78

The sampler's mask of the vocabulary per token along a statement (mean and first-token
max; "floor": under a grammar of that one statement alone), and tokens/s generating
the case's answer under its grammar and without one:

    case                           bytes   mask ms  max  floor   tok/s  no grammar
    1 view (players)               4,387     5.5    13    4.1     57.9    107.2
    2-view join (players, servers) 7,386     5.0    14    3.8     56.3    103.6
    3-view chain (DAU by region)  11,498     4.6    16    3.9     65.4     97.9
    the chain in 5 views          29,363     4.2    22    3.2     55.4     91.1

The first tokens after SELECT cost most, while every view's items are alive; on
average the mask stays within 1.5 ms of its floor at every size here. The gap to the
speed without a grammar is mostly that floor (4 ms beside a ~10 ms token), which no
formulation of the grammar removes. (The 15-40 s per statement once measured for
three views and three joins did not reproduce on this llama.cpp: there too the mask
costs 5-8 ms per token.)

All 14 demo views make 236 KB, past the 64 KiB a `GrammarConstraint` carries:
`choose_views` picks the views a question needs (at most MAX_GRAMMAR_VIEWS), and a
pipeline sends at most GRAMMAR_MAX_BYTES.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.validator import DIALECT

# Columns that link two views: a join may match on them, and only on them.
DEFAULT_JOIN_KEYS = ("player_id", "server_id", "order_id", "day", "region_id", "tier_id")
# Views one statement may read (two JOINs). A fourth would multiply the scopes again.
MAX_JOIN_VIEWS = 3
# How many views a grammar covers (choose_views): by default, and at most. Measured
# on the 325 questions of evals/sql/game-ops.yaml, the views of a gold statement are
# all covered for 80% of them by the fixed best 3, 90% by choose_views with 4 (3.1
# views on average), 91% with 5 (3.5). What llama.cpp's sampler keeps alive before
# FROM grows with the views: at 5, masking the vocabulary takes 4.2 ms a token on
# average and 22 ms at the first, against 3.2 ms for any grammar (module docstring).
GRAMMAR_VIEWS = 4
MAX_GRAMMAR_VIEWS = 5
# A view whose retrieval score is within this of the best one's is as good a match:
# E5's cosines of one question sit in a narrow band (the gold views of the eval set
# score within 0.034 of the best for 90% of the questions).
SCORE_MARGIN = 0.02
# The largest grammar a pipeline sends (bytes): the worst 5 of the 14 demo views make
# 37.6 KB in 0.8 ms (tests/unit/test_sql_grammar.py, `sy bench sql-grammar`); 6 would
# near the 64 KiB a GrammarConstraint carries.
GRAMMAR_MAX_BYTES = 48 * 1024
# Keys one ON may match at once (`a.day = b.day AND a.server_id = b.server_id`).
MAX_ON_KEYS = 3

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

# Expressions that read no column of the statement's own views: numbers, COUNT(*),
# dates and `(SELECT MAX|MIN(col) FROM view)` (rule `sub`, written per grammar).
_FREE = (
    "z-d ::= date | sub",
    'z-fn ::= "DATE_SUB(" z-d ", INTERVAL " int " DAY)"',
    "z-st ::= num | z-fn",
    "z-sa ::= z-st (op z-st){0,2}",
    'z-ag ::= "COUNT(*)" | agg z-sa ")"',
    "z-mt ::= z-ag | z-st",
    "z-ma ::= z-mt (op z-mt){0,2}",
    'z-i ::= (z-ma | "ROUND(" z-ma ", " [0-4] ")") (" AS " alias)?',
)


@dataclass(frozen=True)
class _View:
    sql: str  # how a statement names it: `players`, or `schema.players` off the default
    name: str  # unqualified, as `views` names it
    columns: tuple[str, ...]  # sorted, as written in SQL
    listed: bool  # the policy lists its columns (rather than "*")


Scope = tuple[int, ...]  # indices of the grammar's views one FROM clause reads, ascending


def select_grammar(
    policy: Policy,
    views: Sequence[str] | None = None,
    *,
    columns: Mapping[str, Sequence[str]] | None = None,
    join_keys: Sequence[str] = DEFAULT_JOIN_KEYS,
    join_views: int = MAX_JOIN_VIEWS,
    subquery_views: Sequence[str] = (),
) -> str:
    """The GBNF grammar (root rule `root`) of the SELECTs `policy` allows.

    `views` keeps only those views (unqualified names; a name the policy lacks is
    a `ValueError`). A view the policy allows as `"*"` has no column list to
    enumerate: its columns come from `columns` (keyed by unqualified or
    `schema.view` name), and without an entry there the view is left out.
    `join_keys` are the column names a join may match on; empty means no joins.
    `join_views` is how many views one statement may join (1: none, 2: one JOIN,
    3: a chain of two). `subquery_views` are further views (beyond `views`) that
    only `(SELECT MAX|MIN(col) FROM view)` may read, e.g. the one a convention
    takes "the latest day" from. Views outside `policy.database` are named
    `schema.view`; the rest unqualified. Raises `ValueError` when no view remains.
    """
    given = columns or {}
    chosen = _views(policy, views, given)
    if not chosen:
        raise ValueError("no view of the policy has known columns to build a grammar from")
    names = {v.sql for v in chosen}
    extra = [v for v in _views(policy, subquery_views, given) if v.sql not in names]
    edges = join_edges([v.columns for v in chosen], join_keys)
    scopes = join_scopes(len(chosen), edges, join_views)
    # `*` reads every column of the view; the validator allows it only where the
    # allowed columns are the whole view.
    exact = policy.exact_columns
    star = [s for s in scopes if exact or not any(chosen[i].listed for i in s)]
    lines = [f"c{i} ::= {_alternatives(v.columns)}" for i, v in enumerate(chosen)]
    lines += [f"k{i} ::= {_alternatives(v.columns)}" for i, v in enumerate(extra)]
    lines.append(_sub(chosen, extra, exact))
    lines += _FREE
    for i, view in enumerate(chosen):
        lines += _form(f"u{i}", f"c{i}")
        lines.append(f"q{i}-r ::= {_lit(view.sql + '.')} c{i}")
        lines += _form(f"q{i}", f"q{i}-r")
    head = _select_list(len(chosen), scopes, star)
    for scope in scopes:
        lines += _from(scope, chosen, edges)
        lines += _tail(scope)
    for (i, j), keys in sorted(edges.items()) if join_views >= 2 else ():
        lines.append(_on(i, j, chosen, keys))
        lines.append(_on(j, i, chosen, keys))
    return "\n".join(head + lines + list(_COMMON) + _alias_rules()) + "\n"


def choose_views(
    question: str,
    ranked: Sequence[str],
    columns: Mapping[str, Sequence[str]],
    *,
    scores: Mapping[str, float] | None = None,
    join_keys: Sequence[str] = DEFAULT_JOIN_KEYS,
    limit: int = GRAMMAR_VIEWS,
    margin: float = SCORE_MARGIN,
) -> list[str]:
    """The views a question's grammar covers, most needed first, at most `limit`.

    `ranked` is every candidate view, best retrieval match first; `columns` their
    column names; `scores` their retrieval scores, if known. In order:

    1. the best-ranked view;
    2. views the question names (every word of the name, e.g. "servers", "pay tiers");
    3. for a column the question names ("country", "d7", "device") that no view so
       far has: the best-ranked view that has it;
    4. for two of those that share no join key and no view so far links: the
       best-ranked view that shares a key with both (players -> servers -> regions);
    5. views whose score is within `margin` of the best one (E5's cosines sit in a
       narrow band, so the margin is small; see SCORE_MARGIN).

    Deterministic: the same question, ranking and columns give the same views.
    """
    if limit < 1 or not ranked:
        return []
    words = set(re.findall(r"[a-z0-9]+", question.lower()))
    cols = {v: {c.lower() for c in columns.get(v, ())} for v in ranked}
    keys = {k.lower() for k in join_keys}
    chosen: list[str] = []

    def add(view: str) -> None:
        if view not in chosen and len(chosen) < limit:
            chosen.append(view)

    def shares_key(a: str, b: str) -> bool:
        return bool(cols[a] & cols[b] & keys)

    add(ranked[0])
    for view in ranked:
        if _named(view, words):
            add(view)
    for view in ranked:
        for col in sorted(cols[view]):
            if _named(col, words) and not any(col in cols[c] for c in chosen):
                add(view)
    needed = list(chosen)
    for a, b in itertools.combinations(needed, 2):
        if shares_key(a, b) or any(shares_key(a, c) and shares_key(c, b) for c in chosen):
            continue
        link = next((c for c in ranked if shares_key(a, c) and shares_key(c, b)), None)
        if link is not None:
            add(link)
    if scores and ranked[0] in scores:
        best = scores[ranked[0]]
        for view in ranked:
            if view in scores and scores[view] >= best - margin:
                add(view)
    return chosen


def _named(name: str, words: set[str]) -> bool:
    """Whether every part of `name` (split at `_`) is one of `words`, give or take a
    plural `s`."""
    parts = [p for p in name.lower().split("_") if p]
    return bool(parts) and all(
        p in words or p + "s" in words or p.removesuffix("s") in words for p in parts
    )


def anchor_views(text: str) -> list[str]:
    """Views that `text` (e.g. a tenant's conventions) reads in a `(SELECT MAX|MIN(col)
    FROM view)`, in order of first mention: the subqueries the grammar should offer."""
    found = re.findall(r"\(SELECT\s+(?:MAX|MIN)\(\s*\w+\s*\)\s+FROM\s+(\w+)\s*\)", text, re.I)
    return list(dict.fromkeys(found))


def join_edges(
    columns: Sequence[Sequence[str]], join_keys: Sequence[str] = DEFAULT_JOIN_KEYS
) -> dict[tuple[int, int], list[str]]:
    """(i, j) with i < j -> the join keys views i and j share (sorted), for each pair
    of views (given by their columns) that shares at least one."""
    keys = {k.lower() for k in join_keys}
    out: dict[tuple[int, int], list[str]] = {}
    for i, j in itertools.combinations(range(len(columns)), 2):
        shared = sorted(set(columns[i]) & set(columns[j]), key=str.lower)
        on = [c for c in shared if c.strip("`").lower() in keys]
        if on:
            out[(i, j)] = on
    return out


def join_scopes(
    n: int, edges: Mapping[tuple[int, int], Sequence[str]], join_views: int = MAX_JOIN_VIEWS
) -> list[Scope]:
    """Every set of views one FROM clause may read, of `n` views linked by `edges`
    (join_edges): each view alone, each pair that shares a key, each three that a
    chain of two JOINs links; smallest first."""
    out: list[Scope] = [(i,) for i in range(n)]
    if join_views >= 2:
        out += sorted(edges)
    if join_views >= 3:
        for trio in itertools.combinations(range(n), 3):
            linked = sum(pair in edges for pair in itertools.combinations(trio, 2))
            if linked >= 2:  # two edges of three views are a chain
                out.append(trio)
    return out


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
        if not cols:
            continue  # no column to read: an empty alternative is no grammar
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


def _sub(chosen: Sequence[_View], extra: Sequence[_View], exact: bool) -> str:
    """`(SELECT MAX|MIN(col) FROM view)` over the grammar's and the subquery views.

    It reads no column of the statement's own FROM, so it is free in every scope.
    Without exact columns an unqualified name in it could also reach the outer
    views, which must then all allow it: qualified, it reaches only its own view.
    """
    parts = [(v, f"c{i}") for i, v in enumerate(chosen)]
    parts += [(v, f"k{i}") for i, v in enumerate(extra)]
    alts = []
    for view, rule in parts:
        col = rule if exact else f"{_lit(view.sql + '.')} {rule}"
        alts.append(f"{col} {_lit(') FROM ' + view.sql + ')')}")
    return 'sub ::= "(SELECT " ext (' + " | ".join(alts) + ")"


def _form(f: str, ref: str) -> list[str]:
    """Expressions over one view's columns, all spelled one way (form `u<i>`: bare
    names, `q<i>`: `view.col`). `-fn`, `-st`, `-sa`, `-ag`, `-mt`, `-ma` and the item
    `-i` hold at least one such column, so an item belongs to exactly one form (a free
    one to `z-i`); inside them `-sx`, `-sy` and `-mx` may be free instead. `-p` is a
    WHERE predicate."""
    return [
        f'{f}-fn ::= "DATE(" {ref} ")" | "DATE_SUB(" {ref} ", INTERVAL " int " DAY)"',
        f"{f}-st ::= {ref} | {f}-fn",
        f"{f}-sx ::= {f}-st | z-st",
        f"{f}-sa ::= {f}-st (op {f}-sx){{0,2}} | z-st op ({f}-st (op {f}-sx)? | z-st op {f}-st)",
        f"{f}-sy ::= {f}-sa | z-sa",
        f'{f}-ag ::= "COUNT(DISTINCT " {ref} ")" | agg {f}-sa ")"',
        f"{f}-mt ::= {f}-ag | {f}-st",
        f"{f}-mx ::= {f}-mt | z-mt",
        f"{f}-ma ::= {f}-mt (op {f}-mx){{0,2}} | z-mt op ({f}-mt (op {f}-mx)? | z-mt op {f}-mt)",
        f'{f}-i ::= ({f}-ma | "ROUND(" {f}-ma ", " [0-4] ")") (" AS " alias)?',
        f"{f}-p ::= {f}-sa cmp ({f}-sy | str | sub)"
        f' | {f}-sa " BETWEEN " {f}-b " AND " {f}-b'
        f' | {ref} (" IN (" | " NOT IN (") lits ")"'
        f' | {ref} (" IS NULL" | " IS NOT NULL")'
        f' | {ref} (" LIKE " | " NOT LIKE ") str',
        f"{f}-b ::= {f}-sx | str",
    ]


def _key(scope: Iterable[int]) -> str:
    return "-".join(str(i) for i in scope)


def _select_list(n: int, scopes: Sequence[Scope], star: Sequence[Scope]) -> list[str]:
    """`root`: SELECT and the select list up to FROM, tracking the views it has read.

    The FROM clause comes after the columns, so the list carries what it read so far
    in its rule: `s` nothing yet, `lu<i>` bare columns of view i (FROM must be view
    i alone), `lq<i-j..>` qualified columns of those views (FROM must read them all).
    Each item reads one view, or none (`z-i`). A state only ever grows, so the rules
    are acyclic and every list is bounded.
    """
    states = sorted(
        {frozenset(c) for s in scopes for k in range(1, len(s) + 1)
         for c in itertools.combinations(s, k)},
        key=lambda r: (len(r), sorted(r)),
    )  # fmt: skip
    known = set(states)

    def lq(r: Iterable[int]) -> str:
        return f"lq{_key(sorted(r))}"

    enter = " | ".join(f"u{i}-i lu{i} | q{i}-i lq{i}" for i in range(n))
    every = " | ".join(f"f{_key(s)}" for s in scopes)
    first = ['"* FROM " star'] if star else []
    lines = [
        'root ::= "SELECT " "DISTINCT "? (' + " | ".join([*first, "z-i s", "e"]) + ")",
        's ::= (", " z-i){0,6} (", " e | " FROM " all)',
        f"e ::= {enter}",
        f"all ::= {every}",
    ]
    if star:
        lines.append("star ::= " + " | ".join(f"f{_key(s)}" for s in star))
    for i in range(n):
        lines.append(f'lu{i} ::= (", " (z-i | u{i}-i | q{i}-i)){{0,7}} " FROM " f{i}')
    for r in states:
        keep = " | ".join(["z-i", *(f"q{j}-i" for j in sorted(r))])
        grow = [f"q{w}-i {lq(r | {w})}" for w in range(n) if w not in r and r | {w} in known]
        if len(r) == 1:
            grow.append(f"u{min(r)}-i lu{min(r)}")
        sources = " | ".join(f"f{_key(s)}" for s in scopes if r <= set(s))
        out = f'" FROM " ({sources})'
        if grow:
            out = f'(", " ({" | ".join(grow)}) | {out})'
        lines.append(f'{lq(r)} ::= (", " ({keep})){{0,7}} {out}')
    return lines


def _from(
    scope: Scope, views: Sequence[_View], edges: Mapping[tuple[int, int], Sequence[str]]
) -> list[str]:
    """`f<scope>`: the FROM clause of one scope, in any order a chain of JOINs can
    write it (each view joined to one before it), then the rest of the statement."""
    name = f"f{_key(scope)}"
    tail = f"t{_key(scope)}"
    if len(scope) == 1:
        return [f"{name} ::= {_lit(views[scope[0]].sql)} {tail}"]

    def linked(a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in edges

    alts = []
    for a, b in itertools.permutations(scope, 2):
        if not linked(a, b):
            continue
        head = f"{_lit(f'{views[a].sql} JOIN {views[b].sql} ON ')} o{a}-{b}"
        rest = [c for c in scope if c not in (a, b)]
        if not rest:
            alts.append(head)
            continue
        c = rest[0]
        ons = [f"o{x}-{c}" for x in (a, b) if linked(x, c)]
        if ons:
            on = ons[0] if len(ons) == 1 else f"({' | '.join(ons)})"
            alts.append(f"{head} {_lit(f' JOIN {views[c].sql} ON ')} {on}")
    return [f"{name} ::= ({' | '.join(alts)}) {tail}"]


def _on(a: int, b: int, views: Sequence[_View], keys: Sequence[str]) -> str:
    """`o<a>-<b>`: an ON clause of view b joined to view a: one or more of the keys they
    share, in order."""
    left, right = views[a].sql, views[b].sql
    alts = []
    for k in range(1, min(len(keys), MAX_ON_KEYS) + 1):
        for combo in itertools.combinations(keys, k):
            alts.append(_lit(" AND ".join(f"{left}.{c} = {right}.{c}" for c in combo)))
    return f"o{a}-{b} ::= " + " | ".join(alts)


def _tail(scope: Scope) -> list[str]:
    """`t<scope>`: WHERE, GROUP BY, HAVING, ORDER BY and LIMIT over one scope's columns:
    bare or qualified for one view, qualified for a join."""
    t = f"t{_key(scope)}"
    forms = [f"u{scope[0]}", f"q{scope[0]}"] if len(scope) == 1 else [f"q{i}" for i in scope]
    refs = " | ".join(f"c{f[1:]}" if f[0] == "u" else f"{f}-r" for f in forms)
    pred = f'("NOT "? {t}-p)'
    return [
        f'{t} ::= (" WHERE " {t}-w)? '
        f'(" GROUP BY " {t}-r (", " {t}-r){{0,3}} (" HAVING " {t}-h)?)? '
        f'(" ORDER BY " {t}-o (", " {t}-o){{0,2}})? " LIMIT " limit',
        f"{t}-r ::= {refs}",
        f"{t}-p ::= " + " | ".join(f"{f}-p" for f in forms),
        f'{t}-w ::= {t}-cj (" OR " {t}-cj){{0,3}}',
        f'{t}-cj ::= {t}-n (" AND " {t}-n){{0,4}}',
        f'{t}-n ::= "NOT "? {t}-ca',
        f'{t}-ca ::= {t}-p | "(" {t}-w1 ")"',
        f'{t}-w1 ::= {t}-cj1 (" OR " {t}-cj1){{0,3}}',
        f'{t}-cj1 ::= {pred} (" AND " {pred}){{0,4}}',
        f'{t}-h ::= {t}-hp ((" AND " | " OR ") {t}-hp){{0,2}}',
        f"{t}-hp ::= {t}-m cmp {t}-m",
        f"{t}-m ::= " + " | ".join([*(f"{f}-ma" for f in forms), "z-ma"]),
        f"{t}-o ::= {t}-m dir?",
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
                tail = f"[{ALIAS_CHARS}]{{1,{ALIAS_MAX - len(longer)}}}"
            alts.append(f'"{ch}" {tail}'.rstrip())
        others = "".join(c for c in ALIAS_CHARS if c not in nexts)
        rest = ALIAS_MAX - len(prefix) - 1
        alts.append(f"[{others}]" + (f" [{ALIAS_CHARS}]{{0,{rest}}}" if rest > 0 else ""))
        name = "alias" if not prefix else f"alias-{prefix}"
        rules.append(f"{name} ::= " + " | ".join(alts))
    return rules


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
