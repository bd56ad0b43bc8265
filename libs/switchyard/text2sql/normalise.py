"""The one normal form of a question, shared by every exact match on question text.

The pipeline's verified-query and exact-cache lookups and the evaluation's leakage
guard must agree on when two questions are "the same", or the guard would leave in
a verified query the pipeline then matches. Equal normal forms mean: same text up
to Unicode compatibility forms, case, runs of whitespace, and punctuation at the
ends ("How many players?" == "how many  players").
"""

from __future__ import annotations

import unicodedata


def _edge_char(ch: str) -> bool:
    # Whitespace and punctuation (Unicode P*): a trailing "?", a leading "¿" or
    # enclosing quotes do not change what is asked. Symbols (S*) stay: "$" and "%"
    # can carry meaning.
    return ch.isspace() or unicodedata.category(ch).startswith("P")


def normalise_question(text: str) -> str:
    # NFKC first: full-width letters and ligatures become their plain forms, so
    # casefold and the whitespace split see ordinary characters. casefold rather
    # than lower: it is Unicode's caseless-matching fold (e.g. "ß" == "ss").
    folded = unicodedata.normalize("NFKC", text).casefold()
    collapsed = " ".join(folded.split())
    start, end = 0, len(collapsed)
    while start < end and _edge_char(collapsed[start]):
        start += 1
    while end > start and _edge_char(collapsed[end - 1]):
        end -= 1
    return collapsed[start:end]
