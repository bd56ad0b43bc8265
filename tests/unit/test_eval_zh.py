"""The Chinese slice of the evaluation set (issue #22): every `zh` item asks its English
twin's question again, so it must carry the twin's labels and name the same time window
(or the metric path would answer it with another `days` than the twin's gold)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from switchyard.text2sql.evaluation import EvalItem, EvalSet
from switchyard.text2sql.timeframe import days_in, names_unexpressed_period
from tests.conftest import REPO

EVAL_SET = REPO / "evals" / "sql" / "game-ops.yaml"
ITEMS = EvalSet.load(EVAL_SET).items
BY_ID = {i.id: i for i in ITEMS}
ZH = [i for i in ITEMS if i.lang == "zh"]
ENGLISH = [i for i in ITEMS if i.lang == "en"]
ZH_TAGS = {"paraphrase", "mixed"}
_CJK = re.compile(r"[\u4e00-\u9fff]")
_LATIN_WORD = re.compile(r"[A-Za-z]")


def twin(item: EvalItem) -> EvalItem:
    assert item.twin is not None, item.id
    return BY_ID[item.twin]


@pytest.mark.parametrize("item", ZH, ids=lambda i: i.id)
def test_chinese_item_names_its_twins_window(item: EvalItem) -> None:
    english = twin(item)
    assert days_in(item.question) == days_in(english.question), (item.question, english.question)
    assert names_unexpressed_period(item.question) == names_unexpressed_period(english.question)


@pytest.mark.parametrize("item", ZH, ids=lambda i: i.id)
def test_chinese_item_carries_its_twins_labels(item: EvalItem) -> None:
    english = twin(item)
    assert re.fullmatch(r"ev-zh-\d{3}", item.id)
    assert english.lang == "en" and _CJK.search(item.question)
    assert (item.category, item.intent) == (english.category, english.intent)
    assert item.gold == english.gold and item.order_matters == english.order_matters
    assert set(item.tags) - set(english.tags) <= ZH_TAGS
    assert set(english.tags) <= set(item.tags)
    # `mixed` says the question holds English words (DAU, revenue); the others hold none.
    assert ("mixed" in item.tags) == bool(_LATIN_WORD.search(item.question)), item.question


def test_the_slice_covers_the_set() -> None:
    assert len(ZH) >= 66
    assert all(i.twin is None for i in ENGLISH)
    assert {i.category for i in ZH} == {i.category for i in ENGLISH}
    assert {i.intent for i in ZH} == {i.intent for i in ENGLISH}
    # Proportional: no category or intent is more than twice (or under half) its English share.
    for field in ("category", "intent"):
        en = Counter(getattr(i, field) for i in ENGLISH)
        zh = Counter(getattr(i, field) for i in ZH)
        for key, n in en.items():
            share, zh_share = n / len(ENGLISH), zh[key] / len(ZH)
            assert share / 2 <= zh_share <= share * 2, (field, key, zh[key])


def test_deterministic_path_items_all_have_chinese_twins() -> None:
    deterministic = {i.id for i in ENGLISH if {"metric", "verified_paraphrase"} & set(i.tags)}
    assert deterministic <= {i.twin for i in ZH}


def test_paraphrases_come_in_pairs_and_mixed_questions_exist() -> None:
    paraphrased = Counter(i.twin for i in ZH if "paraphrase" in i.tags)
    assert len(paraphrased) >= 20
    assert all(n >= 2 for n in paraphrased.values()), paraphrased
    assert sum("mixed" in i.tags for i in ZH) >= 6
