"""`sy sql ask|fix|review|verify|eval`: questions to a running fleet, the review loop,
and the evaluation harness."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from switchyard.cli import console, err
from switchyard.cli.bus_commands import NatsUrl, cli_connect
from switchyard.cli.knowledge_commands import KnowledgeDir, knowledge_root
from switchyard.config import Settings
from switchyard.messages.sql import (
    IDLE_TIMEOUT,
    AuditEvent,
    SqlAnswer,
    SqlAsk,
    StageEvent,
    StageProgress,
)
from switchyard.text2sql.matching import SEMANTIC_THRESHOLD, VERIFIED_THRESHOLD

Tenant = Annotated[str, typer.Option("--tenant", "-t", help="the tenant asking")]
PolicyDir = Annotated[
    Path | None,
    typer.Option(
        "--policies", help="SQL policy dir (default: SY_SQL_POLICY_DIR or .sy/sql-policies)"
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="print the answer as JSON")]


def _policy_dir(given: Path | None) -> Path:
    return given or Path(os.environ.get("SY_SQL_POLICY_DIR", ".sy/sql-policies"))


def _settings(nats_url: str | None) -> Settings:
    return Settings(nats_url=nats_url) if nats_url else Settings()


def _print_stage(event: StageEvent) -> None:
    brief = {k: v for k, v in event.data.items() if k not in ("plan", "digest", "columns", "facts")}
    text = json.dumps(brief, default=str)
    console.print(f"[dim]{event.seconds * 1000:7.1f} ms[/dim] [cyan]{event.stage:<10}[/cyan] "
                  f"{text[:160]}", highlight=False)  # fmt: skip


def _progress_text(progress: StageProgress) -> str:
    doing = (
        f"working on {progress.stage} for {progress.seconds:.0f} s" if progress.stage else "working"
    )
    tokens = f", {progress.tokens} tokens so far" if progress.tokens is not None else ""
    return f"[dim]{doing}{tokens} ({progress.elapsed:.0f} s in)[/dim]"


def _print_answer(answer: SqlAnswer) -> None:
    color = {"ok": "green", "clarify": "yellow"}.get(answer.status, "red")
    console.print(f"[{color}]{answer.status}[/{color}] via {answer.path} "
                  f"in {answer.duration:.2f}s")  # fmt: skip
    if answer.sql:
        console.print(answer.sql, highlight=False, markup=False)
    if answer.columns:
        table = Table(*answer.columns)
        for row in answer.rows[:30]:
            table.add_row(*("NULL" if c is None else str(c) for c in row))
        console.print(table)
        if len(answer.rows) > 30:
            console.print(f"[dim]... {len(answer.rows) - 30} more rows[/dim]")
    if answer.summary:
        console.print(answer.summary, highlight=False, markup=False)
        if answer.summary_source:
            console.print(f"[dim](summary: {answer.summary_source})[/dim]")
    if answer.clarification:
        console.print(answer.clarification.question)
        for i, option in enumerate(answer.clarification.options, 1):
            console.print(f"  {i}. {option}", highlight=False, markup=False)
    if answer.error and answer.status != "clarify":
        err.print(f"[red]{answer.error.code}:[/red] {answer.error.reason}")


async def _ask(ask: SqlAsk, nats_url: str | None, as_json: bool, timeout: float) -> int:
    from switchyard.text2sql.client import stream_answer

    async with (
        await cli_connect(_settings(nats_url), "sy-sql-ask") as bus,
        contextlib.aclosing(stream_answer(bus, ask, idle_timeout=timeout)) as items,
    ):
        return await _show(items, as_json)


async def _show(items: AsyncIterator[StageEvent | StageProgress | SqlAnswer], as_json: bool) -> int:
    # Keepalives are no stages: on a terminal one status line under the stages says what
    # is under way, redrawn in place and gone before the next stage prints; piped, it
    # draws nothing (rich's Status on a console that is not a terminal).
    working = console.status("", spinner="dots")
    try:
        async for item in items:
            if isinstance(item, StageProgress):
                if not as_json:
                    working.update(_progress_text(item))
                    working.start()
                continue
            working.stop()
            if isinstance(item, StageEvent):
                if not as_json:
                    _print_stage(item)
                continue
            if as_json:
                console.print_json(item.model_dump_json())
            else:
                _print_answer(item)
            return 0 if item.status in ("ok", "clarify") else 1
        return 1
    finally:
        working.stop()


def register(sql: typer.Typer) -> None:
    @sql.command("ask")
    def ask(
        question: Annotated[str, typer.Argument(help="the question, in words")],
        tenant: Tenant,
        nats_url: NatsUrl = None,
        as_json: AsJson = False,
        no_cache: Annotated[bool, typer.Option("--no-cache", help="skip every cache")] = False,
        timeout: Annotated[float, typer.Option(help="seconds of silence to wait")] = IDLE_TIMEOUT,
    ) -> None:
        """Ask a question of a running fleet; stages stream as they happen."""
        message = SqlAsk(tenant=tenant, question=question, no_cache=no_cache)
        raise typer.Exit(asyncio.run(_ask(message, nats_url, as_json, timeout)))

    @sql.command("fix")
    def fix(
        tenant: Tenant,
        statement: Annotated[str, typer.Option("--sql", help="the SQL to check and correct")],
        question: Annotated[str, typer.Option(help="what the SQL is meant to answer")] = (
            "Correct this SQL."
        ),
        nats_url: NatsUrl = None,
        as_json: AsJson = False,
        timeout: Annotated[float, typer.Option(help="seconds of silence to wait")] = IDLE_TIMEOUT,
    ) -> None:
        """Validate a tenant's own SQL; if the walls refuse it, get one corrected version."""
        message = SqlAsk(tenant=tenant, question=question, fix_sql=statement, no_cache=True)
        raise typer.Exit(asyncio.run(_ask(message, nats_url, as_json, timeout)))

    @sql.command("review")
    def review(
        tenant: Tenant,
        since: Annotated[float, typer.Option(help="hours to look back")] = 24.0,
        limit: Annotated[int, typer.Option(help="answers to list")] = 20,
        nats_url: NatsUrl = None,
        requests: Annotated[
            bool, typer.Option("--requests", help="list review requests from the console")
        ] = False,
    ) -> None:
        """Recent questions of a tenant with their SQL, read back from RES (with
        `--requests`: what analysts asked to have reviewed, from AUDIT)."""
        from switchyard.text2sql.review import recent_answers, review_requests

        if requests:

            async def asked() -> list[AuditEvent]:
                async with await cli_connect(_settings(nats_url), "sy-sql-review") as bus:
                    return await review_requests(bus, tenant, since=since * 3600, limit=limit)

            shown = Table("review id", "answer", "question", "sql", "note")
            for e in asyncio.run(asked()):
                answer_id, note = e.detail.get("answer_request_id"), e.detail.get("note")
                shown.add_row(e.request_id, str(answer_id or "-"), (e.question or "")[:60],
                              (e.sql or "")[:80], str(note or ""))  # fmt: skip
            console.print(shown)
            return

        async def run() -> list[SqlAnswer]:
            async with await cli_connect(_settings(nats_url), "sy-sql-review") as bus:
                return await recent_answers(bus, tenant, since=since * 3600, limit=limit)

        table = Table("request id", "status", "path", "question", "sql")
        for a in asyncio.run(run()):
            table.add_row(a.request_id, a.status, a.path, a.question[:60], (a.sql or "")[:80])
        console.print(table)

    @sql.command("verify")
    def verify(
        request_id: Annotated[str, typer.Argument(help="an answer's request id (sy sql review)")],
        tenant: Tenant,
        by: Annotated[str, typer.Option("--by", help="who verified it")],
        tags: Annotated[str, typer.Option(help="comma-separated tags")] = "",
        since: Annotated[float, typer.Option(help="hours to look back")] = 24.0 * 7,
        knowledge_dir: KnowledgeDir = None,
        policy_dir: PolicyDir = None,
        nats_url: NatsUrl = None,
    ) -> None:
        """Promote an answered question into the tenant's verified queries."""
        from switchyard.sqlguard.policy import PolicyStore
        from switchyard.text2sql.knowledge import KnowledgeStore
        from switchyard.text2sql.review import promote, recent_answers

        async def find() -> SqlAnswer | None:
            async with await cli_connect(_settings(nats_url), "sy-sql-verify") as bus:
                found = await recent_answers(bus, tenant, since=since * 3600, limit=100_000)
            return next((a for a in found if a.request_id == request_id), None)

        answer = asyncio.run(find())
        if answer is None:
            err.print(f"[red]no answer {request_id} for {tenant} in RES[/red]")
            raise typer.Exit(1)
        policy = PolicyStore(_policy_dir(policy_dir)).get(tenant)
        if policy is None or not policy.database:
            err.print(f"[red]no SQL policy for {tenant}[/red]")
            raise typer.Exit(1)
        store = KnowledgeStore(knowledge_root(knowledge_dir))
        query = promote(store, answer, verified_by=by, database=policy.database,
                        tags=[t for t in tags.split(",") if t])  # fmt: skip
        console.print(f"verified {query.id}: {query.question}\n{query.sql}", highlight=False)

    @sql.command("eval")
    def evaluate(
        tenant: Tenant,
        eval_set: Annotated[Path, typer.Option("--set", help="evaluation set (YAML)")] = Path(
            "evals/sql/game-ops.yaml"
        ),
        limit: Annotated[int, typer.Option(help="only the first N items (0 = all)")] = 0,
        sample: Annotated[
            int, typer.Option(help="only N items drawn at random (seeded by --seed; 0 = all)")
        ] = 0,
        seed: Annotated[int, typer.Option(help="the seed of --sample")] = 0,
        tag: Annotated[str | None, typer.Option(help="only items with this tag")] = None,
        semantic_cache: Annotated[
            bool, typer.Option(help="run with the semantic cache on (its hits are scored)")
        ] = False,
        semantic_probe: Annotated[
            bool, typer.Option(help="measure the semantic cache policy's false hits only")
        ] = False,
        semantic_threshold: Annotated[
            float, typer.Option(help="cosine a semantic-cache hit needs")
        ] = SEMANTIC_THRESHOLD,
        verified_probe: Annotated[
            bool, typer.Option(help="measure the verified-query match's hits and misses only")
        ] = False,
        verified_threshold: Annotated[
            float, typer.Option(help="cosine a verified-query match needs")
        ] = VERIFIED_THRESHOLD,
        lang: Annotated[str | None, typer.Option(help="only items in this language")] = None,
        generation: Annotated[
            bool, typer.Option(help="let the model write SQL (off: verified and metrics only)")
        ] = True,
        scope: Annotated[str, typer.Option(help="auto | full | retrieval")] = "auto",
        pool: Annotated[str, typer.Option(help="the fleet pool for model calls")] = "sql",
        knowledge_dir: KnowledgeDir = None,
        policy_dir: PolicyDir = None,
        nats_url: NatsUrl = None,
        report_json: Annotated[
            Path | None, typer.Option("--json", help="write outcomes here")
        ] = None,
    ) -> None:
        """Execution accuracy of the pipeline on an evaluation set, with its Wilson interval.

        `--semantic-probe` instead measures the semantic cache's false-hit rate: each item
        asked against a cache of the earlier items' gold SQL (no model involved).
        `--verified-probe` measures the verified-query match the same way: hits, false
        hits and the reachable items it missed."""
        from switchyard.text2sql.evalrun import evaluate as run_eval
        from switchyard.text2sql.evaluation import EvalSet, render_report
        from switchyard.text2sql.pipeline import FlowOptions

        items = EvalSet.load(eval_set).items
        if tag:
            items = [i for i in items if tag in i.tags]
        if lang:
            items = [i for i in items if i.lang == lang]
        if sample and sample < len(items):
            # Seeded, and kept in file order: the same command draws the same items.
            keep = set(random.Random(seed).sample(range(len(items)), sample))
            items = [item for i, item in enumerate(items) if i in keep]
        if limit:
            items = items[:limit]
        if scope not in ("auto", "full", "retrieval"):
            raise typer.BadParameter("--scope: auto, full or retrieval")
        if semantic_probe or verified_probe:
            kind = "verified" if verified_probe else "semantic"
            threshold = verified_threshold if verified_probe else semantic_threshold
            _probe(kind, tenant, items, knowledge_root(knowledge_dir), _policy_dir(policy_dir),
                   threshold, nats_url)  # fmt: skip
            return
        options = FlowOptions(
            semantic_cache=semantic_cache, semantic_threshold=semantic_threshold,
            scope=scope, summary_source="template", generation=generation,
        )  # fmt: skip

        async def run() -> Any:
            async with await cli_connect(_settings(nats_url), "sy-sql-eval") as bus:
                return await run_eval(
                    bus, tenant, items, knowledge_dir=knowledge_root(knowledge_dir),
                    policy_dir=_policy_dir(policy_dir), options=options, pool=pool,
                )  # fmt: skip

        report, removed = asyncio.run(run())
        console.print(f"leakage guard: removed {len(removed)} verified quer"
                      f"{'y' if len(removed) == 1 else 'ies'} {removed}")  # fmt: skip
        console.print(render_report(report))
        if report_json:
            rows = [{"id": o.item.id, "lang": o.item.lang, "category": o.item.category,
                     "correct": o.correct, "path": o.prediction.path,
                     "sql": o.prediction.sql, "error": o.prediction.error,
                     "gold_error": o.gold_error, "seconds": round(o.prediction.seconds, 3),
                     "summary": o.prediction.summary, "ungrounded": o.ungrounded}
                    for o in report.outcomes]  # fmt: skip
            report_json.write_text(json.dumps(rows, indent=1))


def _probe(
    kind: str, tenant: str, items: list[Any], knowledge_dir: Path, policy_dir: Path,
    threshold: float, nats_url: str | None,
) -> None:  # fmt: skip
    from switchyard.text2sql.evalrun import probe_semantic_cache, probe_verified
    from switchyard.text2sql.evaluation import wilson

    probe_fn = probe_verified if kind == "verified" else probe_semantic_cache

    async def run() -> Any:
        async with await cli_connect(_settings(nats_url), "sy-sql-eval") as bus:
            return await probe_fn(bus, tenant, items, knowledge_dir=knowledge_dir,
                                  policy_dir=policy_dir, threshold=threshold)  # fmt: skip

    probe = asyncio.run(run())
    lo, hi = wilson(probe.false_hits, probe.hits) if probe.hits else (0.0, 1.0)
    what = "verified queries" if kind == "verified" else "semantic cache"
    console.print(
        f"{what} at cosine >= {threshold}: {probe.hits} hit(s) in {probe.asked} "
        f"questions, {probe.false_hits} false: false-hit rate "
        f"{probe.false_hit_rate:.1%} "
        f"(95% Wilson {lo:.1%}-{hi:.1%})"
    )
    if kind == "verified":
        console.print(f"reachable items (a verified query returns their gold rows): "
                      f"{probe.reachable}, recall {probe.recall:.1%}")  # fmt: skip
    table = Table("asked", "matched question", "cosine", "right")
    for asked, cached, score, right in probe.examples:
        table.add_row(asked[:60], cached[:60], f"{score:.3f}", "yes" if right else "NO")
    console.print(table)
    if kind == "verified" and probe.missed:
        missed = Table("missed (reachable)", "its verified question", "cosine", title="missed")
        for asked, stored, score in probe.missed:
            missed.add_row(asked[:60], stored[:60], f"{score:.3f}")
        console.print(missed)
