"""Real third-party SQL: every gold query accepted (structure and safety only), its
canonical form stable, and no LLM prediction crashes the validator."""

from __future__ import annotations

from collections import Counter

import pytest

from switchyard.sqlguard import Policy, rules, validate
from switchyard.sqlguard.corpora import default_dir, gold, predictions

CORPORA = default_dir()
pytestmark = pytest.mark.skipif(
    not (CORPORA / "bird_minidev_mysql_gold.json").is_file(), reason=f"no corpora in {CORPORA}"
)
ANY = Policy()


def test_every_gold_query_is_accepted_with_any_table_and_canonical_is_a_fixpoint() -> None:
    statements = gold(CORPORA)
    assert len(statements) >= 800  # 500 BIRD + 210 defog questions, split on ';'
    refused = []
    unstable = []
    for s in statements:
        verdict = validate(s.sql, ANY, allow_any_table=True)
        if not verdict.ok:
            refused.append((s.corpus, s.key, verdict.rule, verdict.detail))
            continue
        assert verdict.sql is not None
        again = validate(verdict.sql, ANY, allow_any_table=True)
        if not again.ok or again.sql != verdict.sql:
            unstable.append((s.corpus, s.key))
    assert refused == []
    assert unstable == []


def test_no_llm_prediction_crashes_the_validator() -> None:
    statements = predictions(CORPORA)
    assert len(statements) == 4500
    outcomes: Counter[str] = Counter()
    for s in statements:
        verdict = validate(s.sql, ANY, allow_any_table=True)
        assert verdict.ok == (verdict.rule is None)
        assert verdict.rule != rules.VALIDATOR_INTERNAL, (s.key, verdict.detail)
        outcomes["ok" if verdict.ok else verdict.rule or "?"] += 1
    # Most predictions are valid MySQL; the rest are refused with a reason, not a crash.
    assert outcomes["ok"] > 3000
    assert sum(outcomes.values()) == 4500
