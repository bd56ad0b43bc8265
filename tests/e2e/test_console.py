"""The web console in a real headless Chromium (Debian's `chromium`, driven by Playwright
with `executable_path`), against a real fleet in this process: validator, executor
(private MariaDB), router publishing tenant status, a llama.cpp worker, sqlflow, and
the edge on a free port.

- a verified question: the stages appear one by one, in order, before the answer, and
  the table holds exactly the rows the executor returns for the verified SQL;
- hostile SQL (`DROP TABLE players` in "fix my SQL"): the rejection is shown in the
  page, not an error;
- the fleet page lists the live worker and the key's tenant's usage only.

Screenshots go to `$SY_CONSOLE_SHOTS` if set, else the test's tmp dir; the path is
printed (`pytest -s` shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from services.router.status import publish_status
from switchyard import subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.messages.sql import Cell, ExecuteReply
from switchyard.text2sql.knowledge import KnowledgeStore
from tests.conftest import REPO
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)
from tests.support.sqlenv import SqlEnv, build, teardown
from tests.support.sqlflow import KNOWLEDGE, sqlflow_in_process
from tests.support.sqlservices import sql_services

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
ENSURE = REPO / "deploy" / "local" / "ensure-chromium.sh"
QUESTION = "Show DAU per server on the latest day."  # verified, several rows, a bar chart
VERIFIED = next(q for q in KnowledgeStore(KNOWLEDGE).load("acme").verified
                if q.question == QUESTION)  # fmt: skip
KEYS: dict[str, dict[str, Any]] = {"sk-acme": {"tenant": "acme"}, "sk-nova": {"tenant": "nova"}}
# The verified path, stage by stage (no cache: the page's "fresh data" box is ticked).
VERIFIED_STAGES = ["verified", "sql", "validation", "explain", "rows", "summary", "chart"]
SLOW = 180_000  # ms: a generated answer is llama.cpp calls on a shared CPU

pytestmark = pytest.mark.timeout(900)


def chromium_or_skip() -> Path:
    """The browser, installed by deploy/local/ensure-chromium.sh if missing; skips only
    when it cannot be installed (not root, no apt), with the script's reason."""
    if CHROMIUM.exists():
        return CHROMIUM
    done = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not CHROMIUM.exists():
        pytest.skip(f"no chromium and it could not be installed: {done.stderr.strip()[-300:]}")
    return CHROMIUM


@pytest.fixture(scope="module")
def console_sqlenv(mysql_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlEnv]:
    env = build(mysql_dsn, tmp_path_factory.mktemp("console-sql"))
    try:
        yield env
    finally:
        teardown(env)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("SY_CONSOLE_SHOTS", tmp_path / "console-shots"))
    where.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {where}")
    return where


@dataclass
class Console:
    url: str
    pool: str
    bus: Bus


@pytest.fixture(scope="module")
async def console(
    nats_url: str, console_sqlenv: SqlEnv, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Console]:
    """The Text2SQL fleet as `tests.support.sqlflow.text2sql_fleet` builds it, plus the
    router's status publisher (which `run_router` starts in production) and the edge."""
    tmp = tmp_path_factory.mktemp("console")
    pool = f"q{uuid.uuid4().hex[:10]}"
    bus = await connect(Settings(nats_url=nats_url), "console-test")
    await provision_pool(bus.js, pool)
    stop = asyncio.Event()
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                sql_services(nats_url, console_sqlenv, sql_explain_max_rows=50_000,
                             sql_explain_large_table_rows=20_000)
            )  # fmt: skip
            router = await stack.enter_async_context(
                router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2,
                                  router_id=f"rt-{pool}")
            )  # fmt: skip
            status = asyncio.create_task(publish_status(router, stop, interval=0.5))
            await stack.enter_async_context(
                worker_in_process(nats_url, pool=pool, engine="llamacpp", assignment="kv",
                                  worker_id=f"{pool}-w0", heartbeat_interval=0.3)
            )  # fmt: skip
            await stack.enter_async_context(
                sqlflow_in_process(nats_url, console_sqlenv, tmp / "index", sql_pool=pool)
            )
            keys = write_keys(tmp / "keys.yaml", KEYS)
            url = await stack.enter_async_context(edge_in_process(nats_url, api_keys_file=keys))
            await wait_for_pool(bus.js, pool)
            yield Console(url, pool, bus)
            stop.set()
            await asyncio.wait_for(status, 10)
    finally:
        stop.set()
        await bus.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    path = chromium_or_skip()
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=str(path), headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )  # fmt: skip
        try:
            yield launched
        finally:
            await launched.close()


async def signed_in(browser: Browser, url: str, path: str, key: str) -> tuple[Page, list[str]]:
    """The page after logging in with `key`, and the list its script errors go to."""
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    failures: list[str] = []
    page.on("pageerror", lambda exc: failures.append(str(exc)))
    page.on("console", lambda m: failures.append(m.text) if m.type == "error" else None)
    await page.goto(url + path)
    await page.fill("#api-key", key)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#app")).to_be_visible()
    return page, failures


def shown(cell: Cell) -> str:
    """A cell as the page writes it (JavaScript's String(), ∅ for NULL)."""
    if cell is None:
        return "∅"
    if isinstance(cell, bool):
        return "true" if cell else "false"
    if isinstance(cell, float) and cell.is_integer():
        return str(int(cell))
    return str(cell)


async def executed_rows(bus: Bus, env: SqlEnv, sql: str) -> list[list[Cell]]:
    reply = await rpc.request(
        bus.nc, subjects.SQL_EXECUTE, env.signed("acme", sql), ExecuteReply, timeout=15
    )
    assert reply.ok, reply.error
    return reply.rows


# Records when each stage item and the first result row enter the page, so the test can
# tell a stream rendered as it happened from one rendered all at once at the end.
WATCH = """() => {
  window.__seen = [];
  const note = (what) => window.__seen.push([what, performance.now()]);
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) {
      if (n.dataset && n.dataset.stage) note(n.dataset.stage);
      if (n.tagName === "TR" && n.parentNode.tagName === "TBODY") note("row");
    }
  }).observe(document.body, { childList: true, subtree: true });
}"""


async def test_verified_question_streams_its_stages_then_the_right_rows(
    console: Console, console_sqlenv: SqlEnv, browser: Browser, shots: Path
) -> None:
    page, failures = await signed_in(browser, console.url, "/console", "sk-acme")
    await expect(page.locator("#whoami")).to_have_text("tenant acme")
    await page.evaluate(WATCH)
    await page.fill("#question", QUESTION)
    await page.check("#no-cache")
    await page.click("#ask-button")
    await expect(page.locator("#result-table")).to_have_attribute(
        "data-complete", "true", timeout=SLOW
    )
    stages = await page.locator("#stages li.stage").evaluate_all(
        "items => items.map(i => i.dataset.stage)"
    )
    assert stages == VERIFIED_STAGES
    seen: list[tuple[str, float]] = [tuple(s) for s in await page.evaluate("window.__seen")]
    order = [what for what, _ in seen if what != "row"]
    assert order == VERIFIED_STAGES
    at = {what: t for what, t in reversed(seen)}  # first time each was seen
    # Streamed: the early stages were on the page before the summary and before the
    # first row of the answer, not painted together at the end.
    assert at["verified"] < at["summary"] and at["rows"] < at["row"], seen

    expected = await executed_rows(console.bus, console_sqlenv, VERIFIED.sql)
    assert len(expected) >= 2
    header = await page.locator("#result-table thead th").all_inner_texts()
    cells = await page.locator("#result-table tbody tr").evaluate_all(
        "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert header == ["server", "dau"]
    assert cells == [[shown(c) for c in row] for row in expected]
    await expect(page.locator("#row-counter")).to_have_text(f"{len(expected)} rows")
    # The validator's verdict is ticked, the chart is drawn from the spec, and the
    # answer can be sent for review.
    await expect(page.locator('li[data-stage="validation"] .tick.ok').first).to_be_visible()
    assert await page.locator("#chart svg rect.bar").count() == len(expected)
    await expect(page.locator("#summary")).not_to_be_empty()
    await page.click("#review-button")
    await expect(page.locator("#review-status")).to_contain_text("Review requested")
    assert await page.locator("#error").is_hidden()
    await page.screenshot(path=str(shots / "ask-verified.png"), full_page=True)
    assert failures == []


async def test_hostile_sql_shows_the_rejection_not_an_error(
    console: Console, browser: Browser, shots: Path
) -> None:
    page, failures = await signed_in(browser, console.url, "/console", "sk-acme")
    await page.fill("#question", "drop the players table")
    await page.click("#fix summary")
    await page.fill("#fix-sql", "DROP TABLE players")
    await page.click("#fix-button")
    rejection = page.locator("#rejection")
    await expect(rejection).to_be_visible(timeout=SLOW)
    await expect(rejection).to_contain_text("refused the statement (rule")
    failed = page.locator('li[data-stage="validation"].failed')
    await expect(failed.first).to_contain_text("rejected by rule")
    # In the page, beside the form, with no error box: a refusal is an answer.
    assert await page.locator("#error").is_hidden()
    await expect(page.locator("#ask-form")).to_be_visible()
    first_sql = page.locator('li[data-stage="sql"]').first
    await expect(first_sql).to_contain_text("DROP TABLE players")
    await page.screenshot(path=str(shots / "ask-rejected.png"), full_page=True)
    assert failures == []


async def test_fleet_page_lists_the_live_workers_and_only_the_keys_tenant(
    console: Console, browser: Browser, shots: Path
) -> None:
    # Both tenants ask (a verified question each, uncached); the router's usage of acme
    # comes from the generated answers of the tests before, and nova's must not show.
    nova = KnowledgeStore(KNOWLEDGE).load("nova").verified[0].question
    async with httpx.AsyncClient(base_url=console.url, timeout=SLOW / 1000) as http:
        asked = await asyncio.gather(*(
            http.post("/v1/sql/ask", json={"question": q, "no_cache": True},
                      headers={"Authorization": f"Bearer {key}"})
            for key, q in (("sk-acme", QUESTION), ("sk-nova", nova))
        ))  # fmt: skip
    assert [r.status_code for r in asked] == [200, 200], [r.text for r in asked]

    page, failures = await signed_in(browser, console.url, "/console/fleet", "sk-acme")
    worker = page.locator(f'#workers tr[data-worker="{console.pool}-w0"]')
    await expect(worker).to_be_visible(timeout=10_000)
    await expect(worker).to_contain_text("llamacpp")
    await expect(worker).to_contain_text("4: 0, 1, 2, 3")
    await expect(worker).to_contain_text("live")
    mine = page.locator(f'#tenants tr[data-router="rt-{console.pool}"]')
    await expect(mine).to_have_count(1)
    await expect(mine).to_have_attribute("data-tenant", "acme")
    tenants = page.locator("#tenants tbody tr[data-tenant]")
    assert set(await tenants.evaluate_all("rows => rows.map(r => r.dataset.tenant)")) == {"acme"}
    await expect(page.locator("#tenant-scope")).to_have_text("tenant acme only")
    assert "nova" not in await page.content()
    # Live: the page keeps refreshing itself.
    before = await page.locator("#updated").inner_text()
    await expect(page.locator("#updated")).not_to_have_text(before, timeout=5000)
    await page.screenshot(path=str(shots / "fleet.png"), full_page=True)
    assert failures == []
