"""`sy bench sql-validate`: validations per second and latency over the SQL corpora.

Every statement of the corpora (gold and LLM predictions) goes through the
validator with `--allow-any-table` semantics, one at a time in this process,
after a warm-up; the figure is the pure validator (no NATS, no audit).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from switchyard.bench.stats import Report, percentile
from switchyard.sqlguard import corpora
from switchyard.sqlguard.policy import Policy
from switchyard.sqlguard.validator import validate


@dataclass
class ValidateBench(Report):
    statements: int
    rounds: int
    validations_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    gold_accepted: int
    gold_total: int
    predictions_accepted: int
    predictions_total: int
    crashes: int
    rejections_by_rule: dict[str, int] = field(default_factory=dict)


def run_validate_bench(directory: Path, rounds: int = 1) -> ValidateBench:
    gold = corpora.gold(directory)
    preds = corpora.predictions(directory)
    everything = gold + preds
    policy = Policy()
    for statement in everything[:100]:  # warm-up: imports, caches, branch predictors
        validate(statement.sql, policy, allow_any_table=True)
    latencies: list[float] = []
    crashes = 0
    rejected: Counter[str] = Counter()
    accepted = {"gold": 0, "llm": 0}
    started = time.perf_counter()
    for rnd in range(rounds):
        for statement in everything:
            t0 = time.perf_counter()
            try:
                verdict = validate(statement.sql, policy, allow_any_table=True)
            except Exception:  # validate() never raises; counted if it ever does
                crashes += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if rnd:
                continue
            if verdict.ok:
                accepted["llm" if statement.corpus.startswith("llm:") else "gold"] += 1
            else:
                rejected[verdict.rule or "?"] += 1
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return ValidateBench(
        statements=len(everything),
        rounds=rounds,
        validations_per_s=round(len(latencies) / elapsed, 1),
        p50_ms=round(statistics.median(ordered) * 1000, 3) if ordered else 0.0,
        p99_ms=round(percentile(ordered, 0.99) * 1000, 3),
        max_ms=round(ordered[-1] * 1000, 3) if ordered else 0.0,
        gold_accepted=accepted["gold"],
        gold_total=len(gold),
        predictions_accepted=accepted["llm"],
        predictions_total=len(preds),
        crashes=crashes,
        rejections_by_rule=dict(rejected.most_common()),
    )
