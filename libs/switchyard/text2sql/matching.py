"""When a stored question may answer a new one: close in meaning AND the same specifics.

Sentence embeddings see "DAU over the last 5 days" and "DAU yesterday" as near
duplicates (cosine 0.90 with multilingual-e5-small), and "昨天的日活" and
"昨天有多少玩家注册" too (0.89): the numbers, the time window and the measure,
which decide the answer, barely move the vector. True rewordings, meanwhile, and
a Chinese question against its English twin, score anywhere from 0.78 up. So a
score decides nothing alone. A stored question's SQL is reused only when both
questions name

- the same time window (`timeframe.days_in`: "last week" == "过去7天" == 7 days)
  and no period a day count cannot express;
- the same other numbers ("top 10" == "前10名"; the window's own number aside);
- the same metrics and terms of the tenant's vocabulary (`vocabulary`: DAU ==
  日活, revenue == 收入 == 流水, "by channel" == 按渠道, "most" == 最多) -
  and, unless the two are near-repeats, at least one of them;

and the cosine clears a floor that keeps unrelated questions out. The floor was
measured on the evaluation set's paraphrases and Chinese twins (`sy sql eval
--verified-probe`, deploy/text2sql.md has the figures).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from switchyard.text2sql.timeframe import chinese_numeral, days_in, names_unexpressed_period
from switchyard.text2sql.vocabulary import Vocabulary

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_EN_NUMBER = re.compile(
    r"\b(two|three|four|five|six|seven|eight|nine|ten|twenty|thirty|fifty|hundred)\b", re.ASCII
)
_EN_VALUES = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
              "nine": 9, "ten": 10, "twenty": 20, "thirty": 30, "fifty": 50,
              "hundred": 100}  # fmt: skip
# A Chinese count is a numeral run after 前/第 ("top", "-th") or before a measure word:
# 一 alone is also "a" and "once" (一下, 一共), which count nothing.
_ZH_NUMBER = re.compile(
    r"(?<=[前第])([零〇一二三四五六七八九十两百]+)|([零〇一二三四五六七八九十两百]+)"
    r"(?=\s*(?:名|位|个|笔|单|次|级|人|款|天|日|周|星期|礼拜|月|年))"
)
# "前10名", "前十": Chinese for "top N".
_ZH_TOP = re.compile(r"前\s*(?:\d+|[一二三四五六七八九十两百]+)\s*(?:名|位|个)?")
# Cosine a stored question needs, besides the same specifics. e5 puts the demo's true
# paraphrases and Chinese twins at 0.78 and above and unrelated questions up to ~0.9,
# which the specifics then tell apart.
VERIFIED_THRESHOLD = 0.78
SEMANTIC_THRESHOLD = 0.90
# The nearest stored questions judged: the nearest by cosine may name another window or
# measure while the second or third is the rewording.
CANDIDATES = 3
# Two questions that name nothing of the vocabulary share nothing checkable: only a
# near-repeat (case, punctuation, a word's ending) may reuse the other's SQL.
NEAR_REPEAT = 0.97


@dataclass(frozen=True)
class Specifics:
    days: int | None
    other_period: bool  # names a period no day count expresses (今年, "this year")
    numbers: frozenset[str]
    concepts: frozenset[str]


def specifics(question: str, vocabulary: Vocabulary) -> Specifics:
    """What in a question decides its answer, beyond what it is roughly about."""
    days = days_in(question)
    numbers = frozenset(_numbers(question))
    if days is not None:
        # The window is compared as days, so the numbers that can spell it ("7 days",
        # "2 weeks", "1 month") are not compared again as numbers.
        numbers -= {str(days), str(days // 7) if days % 7 == 0 else "", str(days // 30)}
    concepts = vocabulary.read(question).concepts
    if _ZH_TOP.search(question):
        concepts |= {"most"}
    return Specifics(days, names_unexpressed_period(question), numbers, concepts)


def _numbers(question: str) -> set[str]:
    """Every count the question names, in digits, English words or Chinese numerals."""
    found = set(_NUMBER.findall(question))
    found |= {str(_EN_VALUES[w]) for w in _EN_NUMBER.findall(question.lower())}
    for m in _ZH_NUMBER.finditer(question):
        if (value := chinese_numeral(m.group(1) or m.group(2))) is not None:
            found.add(str(value))
    return found


def reusable(
    question: str, stored: str, score: float, threshold: float, vocabulary: Vocabulary
) -> bool:
    """A stored question's SQL may answer `question`: close enough, same specifics, and
    either naming something of the vocabulary to agree on or all but the same text."""
    if score < threshold:
        return False
    mine = specifics(question, vocabulary)
    if mine != specifics(stored, vocabulary):
        return False
    return bool(mine.concepts) or score >= NEAR_REPEAT
