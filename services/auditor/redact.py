"""Secrets out of audit records before they are stored.

Redacted wherever they appear in a string (question, SQL, detail and plan
values): API keys (`sk-...`), passwords inside DSNs (`scheme://user:pw@host`),
bearer tokens, JWTs, GitHub/Slack tokens, AWS key ids, `password=...`/
`secret: ...`/`token=...` pairs, `IDENTIFIED BY '...'`; and the whole value of
any mapping key that names a secret.
Result rows are never stored: under a `rows`-like key only a count survives (an
EXPLAIN plan's `rows` estimate is a number and is kept); anything else there is
replaced by `ROWS_OMITTED`, so a reader sees that a producer sent rows.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "[REDACTED]"
ROWS_OMITTED = "[result rows are not stored]"

_SECRET_KEY = re.compile(
    r"(?i)^(password|passwd|pwd|secret|token|api[_-]?key|authorization|auth|dsn|access[_-]?key|"
    r"private[_-]?key|client[_-]?secret|credentials?)$"
)
# Keys that could hold result rows; the model has none, mappings are checked anyway.
ROW_KEYS = frozenset({"rows", "result", "results", "result_rows", "data_rows"})

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # DSN / URL credentials: scheme://user:password@host -> scheme://user:[REDACTED]@host
    # (greedy up to the last `@` of the authority, so a password holding `@` goes whole)
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s/]+@"), rf"\1{MASK}@"),
    # OpenAI/Anthropic-style keys: sk-..., sk-ant-..., sk_live_...
    (re.compile(r"\bsk[-_][A-Za-z0-9_-]{8,}"), MASK),
    # Well-known token shapes, wherever they appear: JWTs, GitHub, Slack, AWS key ids
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), MASK),
    (re.compile(r"\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{20,}"), MASK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    # Bearer / Basic tokens
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    # MySQL: IDENTIFIED BY 'x' / PASSWORD('x')
    (re.compile(r"(?i)(identified\s+by\s+)('[^']*'|\"[^\"]*\")"), rf"\1'{MASK}'"),
    # key=value / key: value / "key": "value"
    (
        re.compile(
            r"(?i)\b((?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|"
            r"client[_-]?secret)[\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"'}]+)"
        ),
        rf"\1{MASK}",
    ),
)


def redact_text(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any) -> Any:
    """A copy of `value` (JSON-like) with secrets masked and row-like keys dropped."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if key.lower() in ROW_KEYS and not _is_count(v):
                out[key] = ROWS_OMITTED
                continue
            out[key] = MASK if _SECRET_KEY.match(key) and v is not None else redact(v)
        return out
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def _is_count(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
