"""What a question is about: the tenant's metrics and terms it names, in any language.

The words come from the knowledge pack: each metric's name and synonyms, the
sample values of the views' columns ("US", "ios", "organic") and the pack's terms
(`terms.yaml`); a term named like a metric or a value adds words for it.
A question is read once, longest phrase first, and each phrase found is removed
before shorter ones are looked for, so a phrase inside a longer one counts only as
the longer one (付费用户人均收入 is ARPPU, not also ARPU's 人均收入; "daily active
users" is DAU, not also "daily").

Latin-script phrases match as whole words (a phrase "dau" is not found in
"daughter"); Chinese is written without spaces, so a CJK phrase matches anywhere.
Word edges are ASCII-only for the same reason: in "昨天的DAU是多少", "DAU" sits
between two CJK characters, which Python's `\\w` would count as letters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from switchyard.text2sql.knowledge import TenantKnowledge
from switchyard.text2sql.normalise import normalise_question

_EDGE = "A-Za-z0-9_"
# A term of this name is read (so its words count as nothing else) and dropped.
IGNORED = "ignore"
_VALUE = re.compile(r"^[A-Za-z][A-Za-z _-]{1,39}$")


def _value_name(sample: str) -> str | None:
    """The concept a column's sample value stands for ("US" -> us, "ads_google" ->
    ads_google), or None for numbers, codes and one-letter values, which would turn
    up in questions as something else."""
    if not _VALUE.match(sample):
        return None
    return re.sub(r"[ -]+", "_", sample.strip().lower())


def _pattern(phrase: str) -> re.Pattern[str]:
    body = re.escape(phrase)
    start = f"(?<![{_EDGE}])" if phrase[0].isascii() and phrase[0].isalnum() else ""
    end = f"(?![{_EDGE}])" if phrase[-1].isascii() and phrase[-1].isalnum() else ""
    # Inner spaces also match hyphens and runs of spaces: "sign up" == "sign-up".
    return re.compile(start + body.replace(r"\ ", r"[\s-]+") + end)


@dataclass(frozen=True)
class Reading:
    """A question read against a vocabulary."""

    concepts: frozenset[str]  # metric and term names
    # The normalised question with the metrics' phrases blanked out, for the shape
    # checks of metric_match ("daily active users" asks for no "daily" series).
    rest: str


class Vocabulary:
    def __init__(self, phrases: dict[str, set[str]], metrics: frozenset[str]) -> None:
        """`phrases`: concept name -> its words. Where two concepts share a phrase, the
        ignored one wins, then metrics and terms, then sample values."""
        self.metrics = metrics

        def rank(name: str) -> int:
            return 0 if name == IGNORED else 2 if name.startswith("=") else 1

        ordered = sorted(
            ((normalise_question(p), name) for name, ps in phrases.items() for p in ps),
            key=lambda pn: (-len(pn[0]), pn[0], rank(pn[1])),
        )
        seen: set[str] = set()
        self._phrases: list[tuple[re.Pattern[str], str]] = []
        for phrase, name in ordered:
            if phrase and phrase not in seen:
                seen.add(phrase)
                self._phrases.append((_pattern(phrase), name.removeprefix("=")))

    @classmethod
    def of(cls, knowledge: TenantKnowledge) -> Vocabulary:
        phrases: dict[str, set[str]] = {}
        for m in knowledge.metrics:
            phrases.setdefault(m.name, set()).update(
                [m.name, m.name.replace("_", " "), *m.synonyms]
            )
        for t in knowledge.terms:
            phrases.setdefault(t.name, set()).update(t.phrases)
        for view in knowledge.views:
            for col in view.columns:
                for sample in col.samples:
                    if (value := _value_name(sample)) is not None:
                        # "=" marks a value (for the ranking above); it is not kept.
                        phrases.setdefault(f"={value}", set()).add(sample)
        return cls(phrases, frozenset(m.name for m in knowledge.metrics))

    def read(self, question: str) -> Reading:
        text = f" {normalise_question(question)} "
        # Blanks keep every length, so a span found in `scan` is the same span in `rest`.
        scan, rest = list(text), list(text)
        found: set[str] = set()
        for pattern, name in self._phrases:
            for m in pattern.finditer("".join(scan)):
                if name != IGNORED:
                    found.add(name)
                for i in range(m.start(), m.end()):
                    scan[i] = " "
                    if name in self.metrics:
                        rest[i] = " "
        return Reading(frozenset(found), "".join(rest))

    def metrics_named(self, question: str) -> frozenset[str]:
        return self.read(question).concepts & self.metrics


_CACHE: dict[tuple[str, str], Vocabulary] = {}
_CACHE_SIZE = 64


def vocabulary_for(knowledge: TenantKnowledge) -> Vocabulary:
    """The vocabulary of this version of a tenant's knowledge (built once per version)."""
    key = (knowledge.tenant, knowledge.version)
    if (found := _CACHE.get(key)) is None:
        if len(_CACHE) >= _CACHE_SIZE:  # old versions: dropped wholesale, rebuilt on use
            _CACHE.clear()
        found = _CACHE[key] = Vocabulary.of(knowledge)
    return found
