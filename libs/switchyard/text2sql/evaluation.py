"""Text2SQL evaluation by execution accuracy.

An item is answered correctly when the rows its predicted SQL returns equal the rows
of ANY of its gold statements: compared as multisets unless order matters, up to a
permutation of columns, numbers with a relative tolerance. Comparing results rather
than SQL text accepts every correct formulation (raw or pre-aggregated table, other
aliases or join order) and nothing that merely looks similar.

The harness never hides a broken gold statement: an item whose gold fails to run is
counted wrong and carries `gold_error`, so a bad evaluation set shows up as such
instead of as a silently easier one.

Every answer's summary is checked against the facts it was written from
(`facts.ungrounded`): the report counts the summaries that state a number, date or
name absent from them, which should be none.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from rich.console import Group
from rich.table import Table
from rich.text import Text

from switchyard.messages.sql import ResultFacts
from switchyard.sqldb.cells import Cell
from switchyard.text2sql.facts import ungrounded
from switchyard.text2sql.normalise import normalise_question

if TYPE_CHECKING:
    from switchyard.text2sql.knowledge import TenantKnowledge

REL_TOL = 1e-6
ABS_TOL = 1e-9
# Column permutations tried per comparison: wide results with many interchangeable
# columns would otherwise take factorial time for one item.
MAX_PERMUTATIONS = 2000

Intent = Literal["metric", "lookup", "trend", "breakdown"]
Language = Literal["en", "zh"]
ItemId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class EvalSetError(ValueError):
    """An evaluation file that cannot be used; the message names the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvalItem(_Strict):
    id: ItemId
    question: NonEmpty
    category: NonEmpty  # business area: activity, revenue, retention, ...
    intent: Intent
    gold: Annotated[list[NonEmpty], Field(min_length=1)]
    order_matters: bool = False
    tags: list[NonEmpty] = []
    # The language the question is asked in; a question in another language than its
    # English `twin` must be answered with the twin's rows (its gold is the twin's).
    lang: Language = "en"
    twin: ItemId | None = None


class EvalSet(_Strict):
    items: list[EvalItem]

    @model_validator(mode="after")
    def _unique_ids(self) -> EvalSet:
        counts = Counter(i.id for i in self.items)
        if dupes := sorted(k for k, n in counts.items() if n > 1):
            raise ValueError(f"duplicate item ids: {dupes}")
        by_id = {i.id: i for i in self.items}
        for item in self.items:
            if item.twin is None:
                continue
            twin = by_id.get(item.twin)
            if twin is None or twin.twin is not None:
                raise ValueError(f"{item.id}: twin {item.twin!r} is not an item without a twin")
            if set(item.gold) != set(twin.gold) or item.order_matters != twin.order_matters:
                raise ValueError(f"{item.id}: gold differs from its twin {twin.id}'s")
        return self

    @classmethod
    def load(cls, path: Path) -> EvalSet:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise EvalSetError(f"{path}: cannot read: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise EvalSetError(f"{path}: {exc}") from exc


@dataclass
class ResultSet:
    columns: list[str]
    rows: list[list[Cell]]


# -- comparing results ------------------------------------------------------------

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_DATETIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2}(\.\d+)?)$")

# A normalised cell: a number, a string, or None. Numbers become floats so that the
# same value read as int, float, bool or DECIMAL text compares equal.
Value = float | str | None


def _value(cell: Cell) -> Value:
    if cell is None:
        return None
    if isinstance(cell, bool | int | float):
        return float(cell)
    text = cell.strip()
    if _NUMBER.match(text):
        return float(text)
    if m := _DATETIME.match(text):
        return f"{m.group(1)} {m.group(2)}"  # one separator for ISO and SQL forms
    return cell


def _same_value(a: Value, b: Value) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return a == b


def _key(v: Value) -> tuple[int, float | str]:
    """A sort and bucket key; numbers rounded so near-equal ones usually collide."""
    if v is None:
        return (0, "")
    if isinstance(v, float):
        return (1, float(f"{v:.6g}"))
    return (2, v)


def _same_rows(pred: list[tuple[Value, ...]], gold: list[tuple[Value, ...]], ordered: bool) -> bool:
    if len(pred) != len(gold):
        return False
    if ordered:
        return all(
            all(_same_value(a, b) for a, b in zip(p, g, strict=True))
            for p, g in zip(pred, gold, strict=True)
        )
    # Multiset match: exact buckets by rounded key first, then a tolerant search for
    # the few rows whose rounding fell on the other side of a digit.
    buckets: dict[tuple[tuple[int, float | str], ...], list[int]] = defaultdict(list)
    for i, row in enumerate(gold):
        buckets[tuple(_key(v) for v in row)].append(i)
    used = [False] * len(gold)
    for row in pred:
        found = next((i for i in buckets.get(tuple(_key(v) for v in row), []) if not used[i]), None)
        if found is None:
            found = next(
                (
                    i
                    for i, g in enumerate(gold)
                    if not used[i] and all(_same_value(a, b) for a, b in zip(row, g, strict=True))
                ),
                None,
            )
        if found is None:
            return False
        used[found] = True
    return True


def _column(rows: list[tuple[Value, ...]], j: int) -> list[tuple[int, float | str]]:
    return sorted(_key(r[j]) for r in rows)


def _permutations(candidates: list[list[int]]) -> Iterator[list[int]]:
    """Assignments of pred columns to gold columns, each from its candidates."""
    width = len(candidates)
    chosen: list[int] = []
    taken: set[int] = set()

    def walk(j: int) -> Iterator[list[int]]:
        if j == width:
            yield list(chosen)
            return
        for i in candidates[j]:
            if i not in taken:
                chosen.append(i)
                taken.add(i)
                yield from walk(j + 1)
                taken.discard(i)
                chosen.pop()

    return walk(0)


def same_result(pred: ResultSet, gold: ResultSet, *, order_matters: bool) -> bool:
    """Execution-accuracy equality: same rows, columns matched by content, not name."""
    width = len(gold.columns)
    if len(pred.columns) != width or len(pred.rows) != len(gold.rows):
        return False
    prows = [tuple(_value(c) for c in row) for row in pred.rows]
    grows = [tuple(_value(c) for c in row) for row in gold.rows]
    if width == 0:
        return True
    # Only pred columns whose values (as a multiset) equal a gold column's can stand
    # for it; this prunes the permutations to the genuinely ambiguous ones.
    pcols = [_column(prows, j) for j in range(width)]
    candidates = []
    for j in range(width):
        gcol = _column(grows, j)
        # Identity first: the common case is columns already in the gold's order.
        order = [j, *(i for i in range(width) if i != j)]
        candidates.append([i for i in order if _close_columns(pcols[i], gcol)])
        if not candidates[-1]:
            return False
    for tried, perm in enumerate(_permutations(candidates)):
        if tried >= MAX_PERMUTATIONS:
            return False
        permuted = [tuple(row[i] for i in perm) for row in prows]
        if _same_rows(permuted, grows, order_matters):
            return True
    return False


def _close_columns(a: list[tuple[int, float | str]], b: list[tuple[int, float | str]]) -> bool:
    # Only a pruning step, so looser than the row comparison: keys are rounded to 6
    # significant digits, which can move values that are within REL_TOL further apart.
    for (ta, va), (tb, vb) in zip(a, b, strict=True):
        if ta != tb:
            return False
        if isinstance(va, float) and isinstance(vb, float):
            if not math.isclose(va, vb, rel_tol=1e-4, abs_tol=ABS_TOL):
                return False
        elif va != vb:
            return False
    return True


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% by default); (0, 1) when n is 0.

    Unlike the normal approximation it stays inside [0, 1] and is honest at 0/n and
    n/n, which a small evaluation set hits often.
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} outside 0..{n}")
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# -- running an evaluation ----------------------------------------------------------


@dataclass
class Prediction:
    sql: str | None
    result: ResultSet | None
    path: str  # verified, metric, generated, semantic_cache, clarify, error, ...
    error: str | None = None
    seconds: float = 0.0
    summary: str | None = None
    facts: ResultFacts | None = None


@dataclass
class ItemOutcome:
    item: EvalItem
    prediction: Prediction
    correct: bool
    gold_error: str | None
    # What the summary states that its facts (and the question) do not: should be empty.
    ungrounded: list[str] = field(default_factory=list)


def summary_check(item: EvalItem, pred: Prediction) -> list[str]:
    """The numbers, dates and names the summary states that are absent from its facts."""
    if not pred.summary or pred.facts is None:
        return []
    return ungrounded(pred.summary, pred.facts, item.question)


Tally = tuple[int, int]  # (correct, n)


@dataclass
class EvalReport:
    outcomes: list[ItemOutcome]
    accuracy: float
    interval: tuple[float, float]
    by_category: dict[str, Tally] = field(default_factory=dict)
    by_path: dict[str, Tally] = field(default_factory=dict)
    by_tag: dict[str, Tally] = field(default_factory=dict)
    # "zh verified": execution accuracy per language and answer path.
    by_language_path: dict[str, Tally] = field(default_factory=dict)

    @property
    def summaries(self) -> int:
        """Answers that carry a summary and the facts it was written from."""
        return sum(1 for o in self.outcomes if o.prediction.summary and o.prediction.facts)

    @property
    def ungrounded_summaries(self) -> list[ItemOutcome]:
        return [o for o in self.outcomes if o.ungrounded]

    @property
    def gold_errors(self) -> list[ItemOutcome]:
        return [o for o in self.outcomes if o.gold_error is not None]


def _tally(pairs: Iterator[tuple[str, bool]]) -> dict[str, Tally]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for key, ok in pairs:
        counts[key][0] += int(ok)
        counts[key][1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(counts.items())}


async def run_evaluation(
    items: Sequence[EvalItem],
    answer: Callable[[EvalItem], Awaitable[Prediction]],
    gold: Callable[[str], Awaitable[ResultSet]],
    *,
    concurrency: int = 1,
) -> EvalReport:
    """Answer every item, run its gold statements, and score.

    `answer` is the system under test; an exception from it is that item's error
    (path "error"), not the run's. `gold` runs one gold statement; each distinct
    statement runs once per evaluation, however many items share it.
    """
    limit = asyncio.Semaphore(max(1, concurrency))
    gold_runs: dict[str, asyncio.Task[ResultSet]] = {}

    def gold_result(sql: str) -> asyncio.Task[ResultSet]:
        if sql not in gold_runs:
            gold_runs[sql] = asyncio.ensure_future(gold(sql))
        return gold_runs[sql]

    async def one(item: EvalItem) -> ItemOutcome:
        async with limit:
            started = time.perf_counter()
            try:
                pred = await answer(item)
            except Exception as exc:  # the item's failure, reported on the item
                pred = Prediction(None, None, "error", f"{type(exc).__name__}: {exc}")
            if not pred.seconds:
                pred.seconds = time.perf_counter() - started
            errors: list[str] = []
            matched = False
            for i, sql in enumerate(item.gold):
                try:
                    expected = await gold_result(sql)
                except Exception as exc:  # a broken gold is reported, never skipped
                    errors.append(f"gold[{i}]: {type(exc).__name__}: {exc}")
                    continue
                if pred.result is not None and same_result(
                    pred.result, expected, order_matters=item.order_matters
                ):
                    matched = True
            gold_error = "; ".join(errors) if errors else None
            return ItemOutcome(item, pred, matched and gold_error is None, gold_error,
                               summary_check(item, pred))  # fmt: skip

    outcomes = list(await asyncio.gather(*(one(item) for item in items)))
    correct = sum(o.correct for o in outcomes)
    n = len(outcomes)
    return EvalReport(
        outcomes=outcomes,
        accuracy=correct / n if n else 0.0,
        interval=wilson(correct, n),
        by_category=_tally((o.item.category, o.correct) for o in outcomes),
        by_path=_tally((o.prediction.path, o.correct) for o in outcomes),
        by_tag=_tally((t, o.correct) for o in outcomes for t in o.item.tags),
        by_language_path=_tally(
            (f"{o.item.lang} {key}", o.correct)
            for o in outcomes
            for key in ("(all)", o.prediction.path)
        ),
    )


def leakage_guard(
    knowledge: TenantKnowledge, items: Sequence[EvalItem]
) -> tuple[TenantKnowledge, list[str]]:
    """The knowledge without verified queries that ARE evaluation questions.

    A verified query whose question equals an eval question (in the pipeline's own
    normal form) would answer that item by lookup and measure nothing; paraphrases
    stay, because matching a rewording is exactly what the verified path must prove.
    Returns the reduced knowledge and the removed query ids.
    """
    asked = {normalise_question(i.question) for i in items}
    kept, removed = [], []
    for query in knowledge.verified:
        if normalise_question(query.question) in asked:
            removed.append(query.id)
        else:
            kept.append(query)
    if not removed:
        return knowledge, []
    return knowledge.model_copy(update={"verified": kept}), removed


# -- reporting ----------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _tally_table(title: str, label: str, tallies: dict[str, Tally]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(label)
    for name in ("correct", "n", "accuracy", "95% interval"):
        table.add_column(name, justify="right")
    for key, (ok, n) in tallies.items():
        lo, hi = wilson(ok, n)
        table.add_row(key, str(ok), str(n), _pct(ok / n if n else 0.0), f"{_pct(lo)}-{_pct(hi)}")
    return table


def render_report(report: EvalReport) -> Group:
    """Accuracy with its Wilson 95% interval, then per category, path and tag."""
    correct = sum(o.correct for o in report.outcomes)
    lo, hi = report.interval
    parts: list[Text | Table] = [
        Text(
            f"execution accuracy {_pct(report.accuracy)} ({correct}/{len(report.outcomes)}), "
            f"95% Wilson interval {_pct(lo)}-{_pct(hi)}",
            style="bold",
        ),
        _tally_table("by category", "category", report.by_category),
        _tally_table("by answer path", "path", report.by_path),
        _tally_table("by language and answer path", "language path", report.by_language_path),
    ]
    if report.by_tag:
        parts.append(_tally_table("by tag", "tag", report.by_tag))
    parts.append(
        Text(
            f"summaries stating a number, date or name absent from their facts: "
            f"{len(report.ungrounded_summaries)} of {report.summaries}",
            style="bold red" if report.ungrounded_summaries else "bold",
        )
    )
    if report.ungrounded_summaries:
        stray = Table("item", "summary", "absent from the facts", title="ungrounded summaries",
                      title_justify="left")  # fmt: skip
        for o in report.ungrounded_summaries:
            stray.add_row(o.item.id, o.prediction.summary or "", ", ".join(o.ungrounded))
        parts.append(stray)
    if report.gold_errors:
        broken = Table("item", "error", title="gold statements that failed", title_justify="left")
        for o in report.gold_errors:
            broken.add_row(o.item.id, o.gold_error or "")
        parts.append(broken)
    return Group(*parts)
