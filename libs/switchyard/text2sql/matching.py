"""When a stored question may answer a new one: similar meaning AND the same specifics.

Sentence embeddings see "DAU over the last 5 days" and "DAU yesterday" as near
duplicates (cosine 0.90 with MiniLM): the numbers and the time window, which
decide the answer, barely move the vector. Reusing a stored question's SQL
therefore also requires that both name the same time window and the same numbers.
"""

from __future__ import annotations

import re

from switchyard.text2sql.timeframe import days_in

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Cosine a stored question needs to be reused. MiniLM puts true paraphrases of the demo
# questions at 0.75-0.82 and different questions at up to 0.91 (`sy sql eval
# --semantic-probe`: every hit at 0.85-0.90 was wrong), so only near-repeats pass.
VERIFIED_THRESHOLD = 0.90
SEMANTIC_THRESHOLD = 0.95


def specifics(question: str) -> tuple[int | None, frozenset[str]]:
    """The time window (days) and the numbers a question names."""
    return days_in(question), frozenset(_NUMBER.findall(question))


def same_specifics(question: str, stored: str) -> bool:
    return specifics(question) == specifics(stored)


def reusable(question: str, stored: str, score: float, threshold: float) -> bool:
    """A stored question's SQL may answer `question`: close enough, same specifics."""
    return score >= threshold and same_specifics(question, stored)
