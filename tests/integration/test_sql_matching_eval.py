"""The verified-query match on the whole evaluation set (English and Chinese), on the
real embedder, validator, executor and MariaDB demo data, without a model.

Every item is matched against acme's verified queries (minus those the leakage guard
removes); a hit is right when the reused SQL returns the item's gold rows. A wrong hit
is an answer that is confidently wrong, so none is allowed; and the Chinese twins and
rewordings of verified questions must reach them."""

from __future__ import annotations

from switchyard.bus.connection import Bus
from switchyard.text2sql.evalrun import probe_verified
from switchyard.text2sql.evaluation import EvalSet
from switchyard.text2sql.matching import VERIFIED_THRESHOLD
from tests.conftest import REPO
from tests.support.sqlenv import SqlEnv
from tests.support.sqlservices import sql_services

KNOWLEDGE = REPO / "deploy" / "knowledge"
EVAL_SET = REPO / "evals" / "sql" / "game-ops.yaml"


async def test_verified_matches_are_never_wrong_and_reach_twins_in_both_languages(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, audit_stream: None
) -> None:
    items = EvalSet.load(EVAL_SET).items
    async with sql_services(nats_url, sqlenv, sql_busy_timeout=10):
        probe = await probe_verified(bus, "acme", items, knowledge_dir=KNOWLEDGE,
                                     policy_dir=sqlenv.policy_dir,
                                     threshold=VERIFIED_THRESHOLD)  # fmt: skip
    wrong = [(q, s, round(c, 3)) for q, s, c, right in probe.examples if not right]
    print(f"verified probe: {probe.hits} hits, {probe.false_hits} false, "
          f"{probe.reachable} reachable, recall {probe.recall:.1%}")  # fmt: skip
    for asked, stored, score in probe.missed:
        print(f"  missed {score:.3f}: {asked} | {stored}")
    assert not wrong, wrong
    hit = {q for q, _, _, right in probe.examples if right}
    zh = [i for i in items if i.lang == "zh"]
    # Chinese questions reach English verified queries at all.
    assert sum(i.question in hit for i in zh) >= 5, sorted(hit)
    assert probe.recall >= 0.6, probe.missed
