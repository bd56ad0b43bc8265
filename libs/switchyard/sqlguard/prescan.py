"""Checks on the raw text and its tokens, before anything is parsed.

They catch what a parser would otherwise normalise away and a server might read
differently: control and invisible characters, look-alike letters and
full-width punctuation outside string literals, executable comments
(`/*! ... */`, `/*M! ... */`) and optimizer hints, and input big or deep enough
to exhaust the parser.
"""

from __future__ import annotations

import re
import unicodedata

from sqlglot.dialects.dialect import Dialect
from sqlglot.tokenizer_core import Token, TokenType

from switchyard.sqlguard import rules
from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.rules import Rejection

# Tab, LF and CR are whitespace to MySQL; every other C0 control (NUL above all) is refused.
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")

# Token types whose text is data (string literals) or a quoted name: any character may
# appear there, since it can only ever be compared with data or with the policy.
_FREE_TEXT = frozenset(
    {
        TokenType.STRING,
        TokenType.NATIONAL_STRING,
        TokenType.RAW_STRING,
        TokenType.BYTE_STRING,
        TokenType.HEX_STRING,
        TokenType.BIT_STRING,
        TokenType.HEREDOC_STRING,
        TokenType.UNICODE_STRING,
        TokenType.IDENTIFIER,  # quoted identifiers; bare words are VAR
    }
)


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "unnamed")
    return f"U+{ord(ch):04X} {name}"


def check_characters(sql: str) -> list[int]:
    """Refuse control and invisible characters; return where non-ASCII spaces are."""
    found = _ASCII_CONTROL.search(sql)
    if found:
        raise Rejection(
            rules.INPUT_CONTROL_CHAR,
            f"control character {_describe(found.group())} at offset {found.start()}",
        )
    spaces: list[int] = []
    for m in _NON_ASCII.finditer(sql):
        category = unicodedata.category(m.group())
        if category == "Zs":
            spaces.append(m.start())
        if category in ("Cc", "Cs"):
            raise Rejection(
                rules.INPUT_CONTROL_CHAR,
                f"control character {_describe(m.group())} at offset {m.start()}",
            )
        if category in ("Cf", "Zl", "Zp"):
            raise Rejection(
                rules.INPUT_INVISIBLE_CHAR,
                f"invisible character {_describe(m.group())} at offset {m.start()}",
            )
    return spaces


def check_comment(text: str) -> None:
    # MySQL runs `/*! ... */` and MariaDB `/*M! ... */` as SQL; `/*+ ... */` are hints
    # that can change session variables (SET_VAR) or the plan.
    if text.startswith(("!", "M!")):
        raise Rejection(
            rules.COMMENT_EXECUTABLE, "executable comments are not allowed", f"/*{text[:40]}*/"
        )
    if text.startswith("+"):
        raise Rejection(rules.COMMENT_HINT, "optimizer hints are not allowed", f"/*{text[:40]}*/")


def tokenize(sql: str, policy: Policy, dialect: Dialect) -> list[Token]:
    """The statement's tokens, after every raw-text check passed."""
    if not sql.strip():
        raise Rejection(rules.INPUT_EMPTY, "empty statement")
    if len(sql) > policy.max_length:
        raise Rejection(
            rules.INPUT_TOO_LONG, f"{len(sql)} characters, more than {policy.max_length}"
        )
    spaces = check_characters(sql)
    tokens = dialect.tokenize(sql)
    if not tokens:
        raise Rejection(rules.INPUT_EMPTY, "no statement, only comments or whitespace")
    if len(tokens) > policy.max_tokens:
        raise Rejection(
            rules.INPUT_TOO_MANY_TOKENS, f"{len(tokens)} tokens, more than {policy.max_tokens}"
        )
    depth = 0
    for token in tokens:
        for comment in token.comments:
            check_comment(comment)
        kind = token.token_type
        if kind == TokenType.HINT:
            raise Rejection(rules.COMMENT_HINT, "optimizer hints are not allowed", token.text[:60])
        if kind == TokenType.L_PAREN:
            depth += 1
            if depth > policy.max_parens:
                raise Rejection(
                    rules.INPUT_TOO_DEEP,
                    f"parentheses nested deeper than {policy.max_parens}",
                )
        elif kind == TokenType.R_PAREN:
            depth -= 1
        if kind not in _FREE_TEXT and not token.text.isascii():
            bad = next(ch for ch in token.text if not ch.isascii())
            raise Rejection(
                rules.INPUT_NON_ASCII,
                f"{_describe(bad)} outside a string literal or quoted name "
                "(look-alike letters and full-width punctuation are refused)",
                token.text[:60],
            )
    if spaces:
        # The tokenizer takes no-break and ideographic spaces for whitespace; MySQL does
        # not. Outside a string literal or quoted name they are a disguise, not layout.
        free = [(t.start, t.end) for t in tokens if t.token_type in _FREE_TEXT]
        for pos in spaces:
            if not any(start <= pos <= end for start, end in free):
                raise Rejection(
                    rules.INPUT_NON_ASCII,
                    f"{_describe(sql[pos])} at offset {pos} outside a string literal or quoted "
                    "name",
                )
    return tokens
