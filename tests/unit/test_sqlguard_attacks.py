"""The attack suite against the validator: every case rejected, with the right rule family,
quickly, and nothing but a Verdict comes back (the validator never raises)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from switchyard.sqldb.naming import Naming
from switchyard.sqldb.provision import tenant_policy
from switchyard.sqlguard import Policy, validate
from tests.support.sql_attacks import ATTACKS, Attack

NAMING = Naming("", "t_", "sy_", b"unit-test-secret")
POLICY = tenant_policy(NAMING, "acme", 1000)
STRICT = POLICY.model_copy(update={"on_missing_limit": "reject", "on_oversized_limit": "reject"})


def render(attack: Attack) -> str:
    return attack.render("t_acme", "t_nova", "game_ops", "game_pay")


def test_the_suite_is_big_and_covers_every_category() -> None:
    counts = Counter(a.category for a in ATTACKS)
    assert len(ATTACKS) >= 150
    for category in (
        "multi_statement", "dml", "ddl", "admin", "file", "sleep_benchmark_lock",
        "recursive_cte", "system_schema", "variables", "locking", "executable_comment",
        "other_tenant", "base_table", "subquery", "cte", "union", "unicode", "enormous",
        "limit_bypass", "function",
    ):  # fmt: skip
        assert counts[category] >= 4, category


@pytest.mark.parametrize(
    "attack", ATTACKS, ids=[f"{a.category}-{i}" for i, a in enumerate(ATTACKS)]
)
def test_attack_is_rejected(attack: Attack) -> None:
    policy: Policy = STRICT if attack.strict else POLICY
    # CPU time of this thread: what the validator itself spent, whatever else the (shared,
    # noisy) machine does meanwhile; a blow-up on a hostile input shows all the same.
    started = time.thread_time()
    verdict = validate(render(attack), policy)
    elapsed = time.thread_time() - started
    assert not verdict.ok, f"accepted: {verdict.sql}"
    assert verdict.sql is None
    assert verdict.rule and verdict.detail
    if attack.expect:
        assert verdict.rule.startswith(attack.expect), (verdict.rule, verdict.detail)
    assert elapsed < 1.0, f"took {elapsed:.2f} CPU s"


@pytest.mark.parametrize(
    "attack",
    [a for a in ATTACKS if a.category in ("other_tenant", "base_table", "cte", "union")],
    ids=lambda a: a.sql[:40],
)
def test_walls_hold_even_with_any_table_off_and_for_the_other_tenant(attack: Attack) -> None:
    """Swap the roles: what acme may not read, nova may not read of acme either."""
    nova = tenant_policy(NAMING, "nova", 1000)
    verdict = validate(attack.render("t_nova", "t_acme", "game_ops", "game_pay"), nova)
    assert not verdict.ok
