"""The SELECT grammar of a policy: llama.cpp parses it, and what it generates validates.

Two matchers, both real: llama.cpp's own grammar sampler (fed a statement token by
token; it decides what the grammar accepts), and a small expander of the GBNF
subset `select_grammar` writes (generates sentences from the text, as llama.cpp
would read it). Sentences are checked by the real validator.
"""

from __future__ import annotations

import ctypes
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from switchyard.engines.base import EngineError
from switchyard.engines.llamacpp import check_gbnf
from switchyard.engines.model_files import smollm2_gguf
from switchyard.sqldb.catalog import BY_NAME, TABLES
from switchyard.sqlguard import Policy, validate
from switchyard.sqlguard.validator import DIALECT
from switchyard.text2sql.grammar import ALIAS_REFUSED, select_grammar

llama_cpp = pytest.importorskip("llama_cpp")

POLICY = Policy(
    database="t_acme",
    exact_columns=True,
    tables={f"t_acme.{t.name}": list(t.columns) for t in TABLES},
)
FULL = select_grammar(POLICY)


# -- a GBNF reader for the subset select_grammar writes ------------------------


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Cls:
    chars: str


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Rep:
    node: Node
    low: int
    high: int


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


Node = Lit | Cls | Ref | Rep | Seq | Alt
_TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<ref>[A-Za-z0-9-]+)'
    r"|(?P<rep>\{\d+(?:,\d+)?\})|(?P<op>[()|?*+]))"
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "]": "]", "[": "["}


def _unescape(body: str) -> list[str]:
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\":
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return out


def _class(body: str) -> str:
    chars, out, i = _unescape(body), [], 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == "-":
            out += [chr(c) for c in range(ord(chars[i]), ord(chars[i + 2]) + 1)]
            i += 3
        else:
            out.append(chars[i])
            i += 1
    return "".join(dict.fromkeys(out))


def parse_gbnf(text: str) -> dict[str, Node]:
    rules: dict[str, Node] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, body = line.split(" ::= ", 1)
        tokens = [(m.lastgroup, m.group(m.lastgroup or "")) for m in _TOKEN.finditer(body)]
        assert "".join(t for _, t in tokens).replace(" ", "") == body.replace(" ", ""), line
        node, rest = _alt(tokens)
        assert not rest, line
        assert name not in rules
        rules[name] = node
    return rules


def _alt(tokens: list[tuple[str | None, str]]) -> tuple[Node, list[tuple[str | None, str]]]:
    options = []
    while True:
        seq, tokens = _seq(tokens)
        options.append(seq)
        if not tokens or tokens[0][1] != "|":
            return (options[0] if len(options) == 1 else Alt(tuple(options))), tokens
        tokens = tokens[1:]


def _seq(tokens: list[tuple[str | None, str]]) -> tuple[Node, list[tuple[str | None, str]]]:
    items: list[Node] = []
    while tokens and tokens[0][1] not in ("|", ")"):
        kind, text = tokens[0]
        tokens = tokens[1:]
        node: Node
        if kind == "lit":
            node = Lit("".join(_unescape(text[1:-1])))
        elif kind == "cls":
            assert not text.startswith("[^")
            node = Cls(_class(text[1:-1]))
        elif kind == "ref":
            node = Ref(text)
        elif text == "(":
            node, tokens = _alt(tokens)
            assert tokens[0][1] == ")"
            tokens = tokens[1:]
        else:
            raise AssertionError(f"unexpected {text}")
        while tokens and (tokens[0][0] == "rep" or tokens[0][1] in ("?", "*", "+")):
            op = tokens[0][1]
            tokens = tokens[1:]
            if op.startswith("{"):
                low, _, high = op[1:-1].partition(",")
                node = Rep(node, int(low), int(high or low))
            else:
                # Unbounded repetition would let a sentence grow past the validator's limits.
                assert op == "?", f"unbounded {op} in the grammar"
                node = Rep(node, 0, 1)
        items.append(node)
    return (items[0] if len(items) == 1 else Seq(tuple(items))), tokens


def refs(node: Node) -> Iterator[str]:
    if isinstance(node, Ref):
        yield node.name
    elif isinstance(node, Rep):
        yield from refs(node.node)
    elif isinstance(node, Seq | Alt):
        for child in node.items if isinstance(node, Seq) else node.options:
            yield from refs(child)


def sample(rules: dict[str, Node], node: Node, rng: random.Random) -> str:
    """One random sentence; repetitions biased to be short, choices uniform."""
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Cls):
        return rng.choice(node.chars)
    if isinstance(node, Ref):
        return sample(rules, rules[node.name], rng)
    if isinstance(node, Rep):
        n = node.low
        while n < node.high and rng.random() < 0.5:
            n += 1
        return "".join(sample(rules, node.node, rng) for _ in range(n))
    if isinstance(node, Seq):
        return "".join(sample(rules, item, rng) for item in node.items)
    return sample(rules, rng.choice(node.options), rng)


def enumerate_all(rules: dict[str, Node], start: str, slack: int) -> set[str]:
    """Every sentence of `start` at most `slack` characters longer than its shortest,
    each character class taken at its first character (classes only hold literal
    data and names)."""

    @cache
    def shortest(node: Node) -> int:
        if isinstance(node, Lit):
            return len(node.text)
        if isinstance(node, Cls):
            return 1
        if isinstance(node, Ref):
            return shortest(rules[node.name])
        if isinstance(node, Rep):
            return node.low * shortest(node.node)
        if isinstance(node, Seq):
            return sum(map(shortest, node.items))
        return min(map(shortest, node.options))

    @cache
    def strings(node: Node, budget: int) -> frozenset[str]:
        if budget < shortest(node):
            return frozenset()
        if isinstance(node, Lit):
            return frozenset([node.text])
        if isinstance(node, Cls):
            return frozenset(node.chars[0])
        if isinstance(node, Ref):
            return strings(rules[node.name], budget)
        if isinstance(node, Alt):
            return frozenset().union(*(strings(o, budget) for o in node.options))
        if isinstance(node, Rep):
            out: set[str] = {""} if node.low == 0 else set()
            for n in range(max(node.low, 1), node.high + 1):
                got = strings(Seq((node.node,) * n), budget)
                if not got:
                    break
                out |= got
            return frozenset(out)
        # What the items after this one need at least is not this one's to spend.
        after = [sum(shortest(i) for i in node.items[k + 1 :]) for k in range(len(node.items))]
        acc = {""}
        for item, reserve in zip(node.items, after, strict=True):
            acc = {a + b for a in acc for b in strings(item, budget - reserve - len(a))}
            if not acc:
                break
        return frozenset(acc)

    return set(strings(rules[start], shortest(rules[start]) + slack))


# -- llama.cpp ----------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab_model() -> Any:
    """The SmolLM2 vocabulary, without weights: enough to parse and run a grammar."""
    return llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)


def llama_accepts(model: Any, gbnf: str, text: str) -> bool:
    """Feed `text` through llama.cpp's grammar sampler, one token at a time.

    A token the grammar cannot take gets logit -inf; the statement is accepted when
    every token passes and end-of-generation is then allowed.
    """
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert sampler
    try:
        tokens = model.tokenize(text.encode(), add_bos=False, special=False)
        for token in [*tokens, model.token_eos()]:
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            array = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if data[0].logit == float("-inf"):
                return False
            if token != model.token_eos():
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


def test_llama_cpp_parses_the_grammar(vocab_model: Any) -> None:
    check_gbnf(vocab_model, FULL)
    check_gbnf(vocab_model, select_grammar(POLICY, ["agg_dau_daily", "servers"]))
    with pytest.raises(EngineError):  # the check is real: it refuses a broken grammar
        check_gbnf(vocab_model, FULL.replace("limit ::=", "limit ::= (", 1))


def test_the_grammar_is_deterministic_acyclic_and_bounded() -> None:
    assert select_grammar(POLICY) == FULL
    shuffled = Policy(
        database="t_acme",
        exact_columns=True,
        tables={f"t_acme.{t.name}": list(reversed(t.columns)) for t in reversed(TABLES)},
    )
    assert select_grammar(shuffled) == FULL
    rules = parse_gbnf(FULL)  # (refuses unbounded * and +)
    for name, node in rules.items():
        for ref in refs(node):
            assert ref in rules, f"{name} names undefined {ref}"
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"recursion: {(*path, name)}"
        if name not in done:
            for ref in refs(rules[name]):
                visit(ref, (*path, name))
            done.add(name)

    visit("root", ())


def test_random_sentences_all_validate_and_llama_cpp_accepts_them(vocab_model: Any) -> None:
    rules = parse_gbnf(FULL)
    rng = random.Random(20261129)
    failures = []
    sentences = [sample(rules, rules["root"], rng) for _ in range(5000)]
    for sql in sentences:
        verdict = validate(sql, POLICY)
        if not verdict.ok:
            failures.append((sql, verdict.rule, verdict.detail))
    assert not failures, failures[:5]
    assert len(set(sentences)) > 4900
    # Every kind of statement shows up.
    text = "\n".join(sentences)
    for part in (" JOIN ", " WHERE ", " GROUP BY ", " HAVING ", " ORDER BY ", "(SELECT M", " AS "):
        assert part in text
    # The reader above reads the grammar as llama.cpp does.
    for sql in sentences[:150]:
        assert llama_accepts(vocab_model, FULL, sql), sql


def test_every_short_sentence_validates() -> None:
    """Breadth-first over two views and their join: every statement up to 9 characters
    over the shortest, and every select list, WHERE, HAVING and ORDER BY clause up to a
    few characters over its shortest, each within the scope's shortest statement."""
    rules = parse_gbnf(select_grammar(POLICY, ["regions", "servers"]))
    root = rules["root"]
    assert isinstance(root, Alt)
    sentences: set[str] = set()
    for scope in root.options:
        assert isinstance(scope, Ref)
        p = scope.name
        sentences |= enumerate_all(rules, p, 9)
        shortest = min(enumerate_all(rules, p, 0))
        assert shortest.startswith("SELECT * FROM ") and shortest.endswith(" LIMIT 1")
        head, tail = shortest.split(" LIMIT ")
        ref = min(enumerate_all(rules, f"{p}-ref", 0))
        group = f"{head} GROUP BY {ref}"
        # rule -> (its place in a statement, at "@", and how many characters over
        # its shortest clause to enumerate)
        clauses = {
            f"{p}-items": (shortest.replace("SELECT *", "SELECT @"), 7),
            f"{p}-cond": (f"{head} WHERE @ LIMIT {tail}", 7),
            f"{p}-hcond": (f"{group} HAVING @ LIMIT {tail}", 7),
            f"{p}-ord": (f"{head} ORDER BY @ LIMIT {tail}", 7),
            f"{p}-sub": (f"{head} WHERE {ref} = @ LIMIT {tail}", 12),
            f"{p}-sfn": (f"{head} WHERE {ref} >= @ LIMIT {tail}", 12),
        }
        for rule, (place, slack) in clauses.items():
            sentences |= {place.replace("@", c) for c in enumerate_all(rules, rule, slack)}
    assert len(sentences) > 20_000, len(sentences)
    for part in (" JOIN ", " WHERE ", " HAVING ", " ORDER BY ", " AS ", "DISTINCT ", "(SELECT "):
        assert any(part in s for s in sentences), part
    failures = [(s, v.rule) for s in sorted(sentences) if not (v := validate(s, POLICY)).ok]
    assert not failures, failures[:5]


@pytest.mark.parametrize(
    "policy",
    [
        # Partial column lists without exact_columns: no `*`, and a subquery's
        # column must be allowed in the views around it too.
        Policy(
            database="t_acme",
            tables={
                "t_acme.players": ["player_id", "server_id", "level", "country"],
                "t_acme.daily_activity": ["day", "player_id", "minutes"],
                "t_acme.servers": "*",
            },
        ),
        # Views of another schema are named in full.
        Policy(
            database="t_other",
            exact_columns=True,
            tables={
                "t_acme.players": list(BY_NAME["players"].columns),
                "t_other.servers": list(BY_NAME["servers"].columns),
            },
        ),
    ],
    ids=["partial-columns", "other-schema"],
)
def test_other_policies_validate_too(policy: Policy) -> None:
    gbnf = select_grammar(policy, columns={"servers": BY_NAME["servers"].columns})
    rules = parse_gbnf(gbnf)
    rng = random.Random(7)
    failures = []
    for _ in range(1500):
        sql = sample(rules, rules["root"], rng)
        if not (v := validate(sql, policy)).ok:
            failures.append((sql, v.rule, v.detail))
    assert not failures, failures[:5]
    if policy.exact_columns:
        assert "FROM t_acme.players" in gbnf
    else:
        assert '"*"' not in gbnf.split("j0-1-items ::= ")[1].split("\n")[0]


def test_views_and_columns_arguments() -> None:
    star = Policy(database="t_acme", tables={"t_acme.players": "*", "t_acme.servers": "*"})
    # A "*" view without known columns is left out...
    only = select_grammar(star, columns={"servers": ["server_id", "name"]})
    assert '"servers"' in only and "players" not in only
    with pytest.raises(ValueError, match="no view"):
        select_grammar(star)
    with pytest.raises(ValueError, match="not views of the policy: secrets"):
        select_grammar(POLICY, ["players", "secrets"])
    small = select_grammar(POLICY, ["Players"], join_keys=())
    assert "JOIN" not in small and "agg_dau_daily" not in small and '"players"' in small


HOSTILE = [
    "DROP TABLE players",
    "DELETE FROM players",
    "UPDATE players SET level = 1 LIMIT 1",
    "INSERT INTO players VALUES (1)",
    "SELECT * FROM mysql.user LIMIT 1",
    "SELECT * FROM information_schema.tables LIMIT 1",
    "SELECT password FROM players LIMIT 1",
    "SELECT opened_on FROM players LIMIT 1",  # a column of another view
    "SELECT a.name FROM players a JOIN servers b ON a.server_id = b.server_id LIMIT 1",
    "SELECT * FROM players -- a comment\n LIMIT 1",
    "SELECT * FROM players LIMIT 1 -- x",
    "SELECT * FROM players /* x */ LIMIT 1",
    "SELECT * FROM players LIMIT 1; DROP TABLE players",
    "SELECT * FROM players LIMIT 1;",
    "SELECT level FROM players UNION SELECT name FROM servers LIMIT 1",
    "SELECT * FROM players INTO OUTFILE '/tmp/x' LIMIT 1",
    "SELECT * FROM players WHERE level = SLEEP(5) LIMIT 1",
    "SELECT LOAD_FILE('/etc/passwd') FROM players LIMIT 1",
    "SELECT * FROM players WHERE nickname = 'x' OR '1'='1' LIMIT 1",
    "SELECT * FROM players WHERE nickname = 'a\\' LIMIT 1",
    "SELECT level AS select FROM players LIMIT 1",
    "SELECT *  FROM players LIMIT 1",
    "SELECT * FROM players",
    "SELECT * FROM players LIMIT 1001",
    "SELECT * FROM players LIMIT 0",
]
ACCEPTED = [
    "SELECT * FROM players LIMIT 10",
    "SELECT day, SUM(dau) AS total_dau FROM agg_dau_daily WHERE day >= "
    "DATE_SUB((SELECT MAX(day) FROM agg_dau_daily), INTERVAL 7 DAY) GROUP BY day "
    "ORDER BY day DESC LIMIT 7",
    "SELECT b.name, COUNT(*) AS players FROM players a JOIN servers b ON "
    "a.server_id = b.server_id WHERE a.country IN ('DE', 'FR') GROUP BY b.name "
    "HAVING COUNT(*) > 10 ORDER BY COUNT(*) DESC LIMIT 1000",
    "SELECT level AS selected, level AS x, level AS mob, level AS nothing, level AS m_od "
    "FROM players LIMIT 1",
]


@pytest.mark.parametrize("sql", HOSTILE)
def test_llama_cpp_rejects_what_the_grammar_must_not_produce(vocab_model: Any, sql: str) -> None:
    assert not llama_accepts(vocab_model, FULL, sql)


@pytest.mark.parametrize("sql", ACCEPTED)
def test_llama_cpp_accepts_typical_analytics(vocab_model: Any, sql: str) -> None:
    assert llama_accepts(vocab_model, FULL, sql)
    assert validate(sql, POLICY).ok


def test_refused_aliases_are_exactly_the_keywords_sqlglot_refuses_after_as() -> None:
    keywords = sorted(
        {k.lower() for k in DIALECT.tokenizer_class.KEYWORDS if re.fullmatch(r"[A-Za-z_]{1,30}", k)}
    )
    refused = {
        k
        for k in keywords
        if not validate(f"SELECT dau AS {k} FROM agg_dau_daily LIMIT 1", POLICY).ok
    }
    assert refused == ALIAS_REFUSED
    rules = parse_gbnf(select_grammar(POLICY, ["agg_dau_daily"]))
    aliases = enumerate_all(rules, "alias", 2)
    assert not aliases & ALIAS_REFUSED
    assert {"a", "m", "mo", "moa", "no", "sel"} <= aliases
    long = {sample(rules, rules["alias"], random.Random(i)) for i in range(3000)}
    assert not long & ALIAS_REFUSED and max(map(len, long)) <= 30
    assert {"moda", "nota", "selecta"} <= enumerate_all(rules, "alias", 6)
