"""Every prompt the pipeline sends to a model, in one place.

The schema part comes first and is the same for every question of a tenant, so
it is the prefix the fleet caches (requests are placed by tenant, salted by
tenant); the question comes last.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from switchyard.messages.inference import ChatMessage
from switchyard.messages.sql import Cell

INTENTS = ("metric", "lookup", "trend", "breakdown", "out_of_scope", "chit_chat")
NO_SQL_INTENTS = frozenset({"out_of_scope", "chit_chat"})


@dataclass(frozen=True)
class Example:
    question: str
    sql: str


@dataclass(frozen=True)
class Failure:
    """Why an attempt was refused: what the retry is told."""

    stage: str  # "validation", "explain" or "execution"
    rule: str | None
    reason: str
    plan: list[dict[str, Any]]

    def describe(self) -> str:
        rule = f" (rule {self.rule})" if self.rule else ""
        return f"{self.stage} refused it{rule}: {self.reason}"


def intent_messages(question: str) -> list[ChatMessage]:
    system = (
        "Classify a question to a game analytics assistant. Answer with one word:\n"
        "metric (one number or KPI), lookup (specific rows), trend (over time), "
        "breakdown (by a category), out_of_scope (not about the game data), "
        "chit_chat (greetings, small talk)."
    )
    shots = [  # small models follow examples better than definitions
        ("What was DAU yesterday?", "metric"),
        ("List the servers in Europe", "lookup"),
        ("Revenue per day over the last 30 days", "trend"),
        ("New players by channel", "breakdown"),
        ("What is the capital of France?", "out_of_scope"),
        ("Hi, how are you?", "chit_chat"),
    ]
    messages = [ChatMessage(role="system", content=system)]
    for q, a in shots:
        messages.append(ChatMessage(role="user", content=q))
        messages.append(ChatMessage(role="assistant", content=a))
    messages.append(ChatMessage(role="user", content=question))
    return messages


def sql_messages(
    question: str, schema: str, conventions: str, examples: Sequence[Example]
) -> list[ChatMessage]:
    system = (
        "You write one MySQL SELECT statement that answers the question, using only "
        "these views and columns.\n\n"
        f"{schema}\n\n"
        f"Conventions:\n{conventions}"
    )
    messages = [ChatMessage(role="system", content=system)]
    for ex in examples:  # few-shot turns: small models follow examples better than rules
        messages.append(ChatMessage(role="user", content=ex.question))
        messages.append(ChatMessage(role="assistant", content=ex.sql))
    messages.append(ChatMessage(role="user", content=question))
    return messages


def retry_messages(
    first: list[ChatMessage],
    sql: str,
    failure: Failure,
    columns: str,
    values: str,
) -> list[ChatMessage]:
    """The first conversation, the refused SQL, and what is new: the rule, the plan,
    the real columns and the values that exist."""
    lines = [f"That SQL was refused. The {failure.describe()}."]
    if failure.plan:
        lines.append("EXPLAIN plan: " + json.dumps(failure.plan[:4], default=str)[:800])
    lines.append(f"The real columns of the views involved:\n{columns}")
    if values:
        lines.append(f"Values that exist in the columns involved:\n{values}")
    lines.append("Write a corrected SELECT statement.")
    return [
        *first,
        ChatMessage(role="assistant", content=sql),
        ChatMessage(role="user", content="\n".join(lines)),
    ]


def result_digest(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], *, include_rows: bool
) -> str:
    """What the summary model sees: the rows only when allowed, else shape and aggregates."""
    head = f"{len(rows)} row(s); columns: {', '.join(columns)}"
    if include_rows:
        body = json.dumps([list(r) for r in rows[:20]], default=str)
        return f"{head}\nrows: {body[:2000]}"
    parts = []
    for i, name in enumerate(columns):
        numbers = [_number(r[i]) for r in rows]
        present = [n for n in numbers if n is not None]
        if present and len(present) == len(rows):
            parts.append(
                f"{name}: min {min(present):g}, max {max(present):g}, sum {sum(present):g}"
            )
        else:
            distinct = len({str(r[i]) for r in rows})
            parts.append(f"{name}: {distinct} distinct value(s)")
    return head + ("\n" + "\n".join(parts) if parts else "")


def summary_messages(
    question: str, template: str, facts: str, rows: str | None = None
) -> list[ChatMessage]:
    """Rephrase the template sentence as the answer to the question, from the facts
    only: the reply is checked, and replaced by the template if it states anything else."""
    system = (
        "Rewrite the draft as one short, plain sentence that answers the question. "
        "Use only the numbers, dates and names in the draft and the facts; add none."
    )
    body = f"Question: {question}\nFacts: {facts}\nDraft: {template}"
    if rows:
        body += f"\nResult: {rows}"
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=body)]


def _number(cell: Cell) -> float | None:
    if isinstance(cell, bool) or cell is None:
        return None
    if isinstance(cell, int | float):
        return float(cell)
    try:
        return float(cell)
    except ValueError:
        return None
