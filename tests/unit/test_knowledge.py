"""Tenant knowledge files: parsing, versioning, policy restriction, edits, the CLI."""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp
from typer.testing import CliRunner

from switchyard.cli.app import app
from switchyard.sqlguard.policy import Policy
from switchyard.text2sql.knowledge import KnowledgeError, KnowledgeStore, VerifiedQuery
from tests.conftest import REPO

SCHEMA = """\
views:
  players:
    description: "One row per registered player"
    columns:
      player_id: {description: "player id", samples: []}
      channel: {description: "acquisition channel", samples: [organic, ads_google]}
      country: {description: "ISO country", samples: [DE, 7, yes]}
  agg_dau_daily:
    description: "Daily active users per day"
    columns:
      day: {description: "calendar day"}
      dau:
"""

METRICS = """\
metrics:
  - name: dau
    description: "Daily active users"
    synonyms: [daily active users, active players per day]
    sql: >-
      SELECT day, SUM(dau) AS dau FROM agg_dau_daily
      WHERE day > CURRENT_DATE - INTERVAL {days} DAY GROUP BY day LIMIT {rows}
    params: {days: 7, rows: 100}
"""

SEMANTICS = """\
Game operations knowledge.

## Players
A player is an account.

## Activity
DAU counts distinct players per day.
"""

VERIFIED = """\
queries:
  - id: vq-acme-001
    question: "How many players registered yesterday?"
    sql: "SELECT COUNT(*) FROM players"
    verified_by: alice
    verified_at: 2026-11-20T10:00:00Z
    tags: [players, registration]
"""


def write_tree(root: Path) -> Path:
    pack = root / "packs" / "game-ops"
    pack.mkdir(parents=True)
    (pack / "schema.yaml").write_text(SCHEMA)
    (pack / "metrics.yaml").write_text(METRICS)
    (pack / "semantics.md").write_text(SEMANTICS)
    for tenant in ("acme", "nova"):
        tdir = root / "tenants" / tenant
        tdir.mkdir(parents=True)
        (tdir / "knowledge.yaml").write_text("pack: game-ops\n")
    (root / "tenants" / "acme" / "verified.yaml").write_text(VERIFIED)
    (root / "tenants" / "nova" / "knowledge.yaml").write_text(
        'pack: game-ops\nnotes: "Nova counts test accounts as players."\n'
    )
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "knowledge")


def query(qid: str, question: str = "How many whales?") -> VerifiedQuery:
    return VerifiedQuery(
        id=qid,
        question=question,
        sql="SELECT 1",
        verified_by="bob",
        verified_at=dt.datetime(2026, 11, 21, tzinfo=dt.UTC),
    )


def test_load_parses_every_file(root: Path) -> None:
    store = KnowledgeStore(root)
    k = store.load("acme")
    assert (k.tenant, k.pack) == ("acme", "game-ops")
    assert [v.name for v in k.views] == ["players", "agg_dau_daily"]
    players = k.view("PLAYERS")
    assert players is not None
    assert players.columns[2].samples == ["DE", "7", "true"]  # YAML scalars become text
    assert k.view("nope") is None
    assert k.metric("dau") is not None and k.metric("wau") is None
    assert [q.id for q in k.verified] == ["vq-acme-001"]
    assert k.verified[0].verified_at == dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)
    assert k.semantics_sections() == [
        ("", "Game operations knowledge."),
        ("Players", "A player is an account."),
        ("Activity", "DAU counts distinct players per day."),
    ]
    assert re.fullmatch(r"[0-9a-f]{16}", k.version)
    assert store.load("acme") is k  # cached while nothing changed


def test_tenant_notes_are_appended_and_verified_is_optional(root: Path) -> None:
    nova = KnowledgeStore(root).load("nova")
    assert nova.verified == []
    assert nova.semantics_sections()[-1] == (
        "Notes for nova",
        "Nova counts test accounts as players.",
    )


def test_schema_text(root: Path) -> None:
    k = KnowledgeStore(root).load("acme")
    assert k.schema_text() == (
        "players: One row per registered player\n"
        "  player_id: player id\n"
        "  channel: acquisition channel [samples: organic, ads_google]\n"
        "  country: ISO country [samples: DE, 7, true]\n"
        "agg_dau_daily: Daily active users per day\n"
        "  day: calendar day\n"
        "  dau"
    )
    # pack order, whatever order the caller names views in; unknown names ignored
    assert k.schema_text(["agg_dau_daily", "ghost", "Players"]) == k.schema_text()
    assert k.schema_text(["agg_dau_daily"]).startswith("agg_dau_daily:")


def test_version_changes_on_any_edit(root: Path) -> None:
    store = KnowledgeStore(root)
    seen = {store.load("acme").version}
    pack = root / "packs" / "game-ops"
    edits = [
        (pack / "schema.yaml", "ISO country", "ISO-3166 country"),
        (pack / "semantics.md", "an account", "a person"),
        (pack / "metrics.yaml", "days: 7", "days: 14"),
        (root / "tenants" / "acme" / "verified.yaml", "alice", "carol"),
        (root / "tenants" / "acme" / "knowledge.yaml", "game-ops\n", 'game-ops\nnotes: "x"\n'),
    ]
    for path, old, new in edits:
        path.write_text(path.read_text().replace(old, new))
        version = store.load("acme").version  # the same store instance sees the edit
        assert version not in seen, path
        seen.add(version)
    # the other tenant shares the pack, so pack edits reach it too
    assert ("Players", "A player is a person.") in store.load("nova").semantics_sections()


def test_restricted_to_policy(root: Path) -> None:
    k = KnowledgeStore(root).load("acme")
    policy = Policy(
        database="t_acme",
        tables={"t_acme.players": ["player_id", "CHANNEL"], "t_other.agg_dau_daily": "*"},
    )
    r = k.restricted_to(policy)
    assert [v.name for v in r.views] == ["players"]  # agg_dau_daily is granted in another schema
    assert [c.name for c in r.views[0].columns] == ["player_id", "channel"]
    assert r.metrics == k.metrics and r.verified == k.verified
    assert r.version != k.version
    assert "country" not in r.schema_text()

    # without a database, a grant in any schema reaches the unqualified view
    r2 = k.restricted_to(Policy(tables={"t_x.agg_dau_daily": "*"}))
    assert [v.name for v in r2.views] == ["agg_dau_daily"]
    assert len(r2.views[0].columns) == 2
    assert k.restricted_to(Policy(database="t_acme")).views == []


def test_metric_render(root: Path) -> None:
    m = KnowledgeStore(root).load("acme").metric("dau")
    assert m is not None
    assert "INTERVAL 7 DAY" in m.render() and m.render().endswith("LIMIT 100")
    assert "INTERVAL 30 DAY" in m.render(days=30)
    with pytest.raises(KnowledgeError, match="unknown params"):
        m.render(weeks=2)
    with pytest.raises(KnowledgeError, match="integer"):
        m.render(days="7; DROP TABLE players")  # type: ignore[arg-type]
    with pytest.raises(KnowledgeError, match="integer"):
        m.render(days=True)


@pytest.mark.parametrize(
    ("relpath", "text", "needle"),
    [
        ("packs/game-ops/schema.yaml", "views: [unclosed", "not valid YAML"),
        ("packs/game-ops/schema.yaml", "- a list", "must be a YAML mapping"),
        ("packs/game-ops/schema.yaml", SCHEMA.replace("samples: []", "sampels: []"),
         r"views\.players\.columns\.player_id\.sampels: Extra inputs"),
        ("packs/game-ops/schema.yaml", SCHEMA + "owner: me\n", "owner: Extra inputs"),
        ("packs/game-ops/metrics.yaml", METRICS.replace("rows: 100", "row: 100"),
         "no default in params"),
        ("packs/game-ops/metrics.yaml", METRICS.replace("days: 7", "days: seven"),
         r"metrics\.0\.params\.days"),
        ("packs/game-ops/metrics.yaml", METRICS.replace("name: dau", "name: DAU"),
         r"metrics\.0\.name"),
        ("packs/game-ops/metrics.yaml", METRICS + METRICS.split("\n", 1)[1], "duplicate metric"),
        ("tenants/acme/verified.yaml", VERIFIED.replace("    verified_by: alice\n", ""),
         r"queries\.0\.verified_by: Field required"),
        ("tenants/acme/verified.yaml", VERIFIED.replace("vq-acme-001", "vq/../x"),
         r"queries\.0\.id"),
        ("tenants/acme/knowledge.yaml", "pack: missing-pack\n", "no pack 'missing-pack'"),
        ("tenants/acme/knowledge.yaml", "pack: ../../etc\n", r"pack: String should match"),
        ("tenants/acme/knowledge.yaml", "pack: game-ops\nextra: 1\n", "extra: Extra inputs"),
    ],
)  # fmt: skip
def test_bad_files_name_file_and_field(root: Path, relpath: str, text: str, needle: str) -> None:
    (root / relpath).write_text(text)
    with pytest.raises(KnowledgeError) as info:
        KnowledgeStore(root).load("acme")
    assert info.value.code == "invalid_request"
    assert relpath in str(info.value)
    assert re.search(needle, str(info.value)), str(info.value)


def test_unknown_tenant_and_traversal(root: Path, tmp_path: Path) -> None:
    store = KnowledgeStore(root)
    with pytest.raises(KnowledgeError) as info:
        store.load("globex")
    assert info.value.code == "unknown_tenant"
    # a knowledge.yaml outside tenants/ that a traversing name would reach
    (root / "packs" / "knowledge.yaml").write_text("pack: game-ops\n")
    (tmp_path / "knowledge.yaml").write_text("pack: game-ops\n")
    for name in ("../packs", "..", "../../", "acme/../nova", "/etc", "Acme", "", "a" * 64):
        with pytest.raises(KnowledgeError) as info:
            store.load(name)
        assert info.value.code == "invalid_request", name
        with pytest.raises(KnowledgeError):
            store.add_verified(name, query("vq-x-1"))


def test_add_and_remove_verified_seen_by_running_store(root: Path) -> None:
    reader = KnowledgeStore(root)  # stands in for a running orchestrator
    before = reader.load("acme")
    writer = KnowledgeStore(root)  # stands in for `sy sql knowledge add-verified`
    qid = writer.next_verified_id("acme")
    assert qid == "vq-acme-002"
    writer.add_verified("acme", query(qid))
    after = reader.load("acme")
    assert [q.id for q in after.verified] == ["vq-acme-001", "vq-acme-002"]
    assert after.version != before.version
    assert after.verified[1].verified_at == dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    with pytest.raises(KnowledgeError, match="already exists"):
        writer.add_verified("acme", query(qid))
    assert writer.next_verified_id("acme") == "vq-acme-003"
    # first verified query of a tenant creates the file
    writer.add_verified("nova", query(writer.next_verified_id("nova")))
    assert [q.id for q in reader.load("nova").verified] == ["vq-nova-001"]

    assert writer.remove_verified("acme", "vq-acme-001") is True
    assert writer.remove_verified("acme", "vq-acme-001") is False
    assert [q.id for q in reader.load("acme").verified] == ["vq-acme-002"]
    # no temporary files left behind
    assert sorted(os.listdir(root / "tenants" / "acme")) == ["knowledge.yaml", "verified.yaml"]


def test_concurrent_adds_lose_nothing(root: Path) -> None:
    errors: list[BaseException] = []

    def add(i: int) -> None:
        try:
            KnowledgeStore(root).add_verified("nova", query(f"vq-nova-t{i:03d}", f"q{i}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(KnowledgeStore(root).load("nova").verified) == 16


def test_cli_show_and_add_verified(root: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["sql", "knowledge", "show", "--tenant", "acme", "--dir", str(root)]
    )
    assert result.exit_code == 0, result.output
    assert "2 views, 1 metrics, 1 verified queries" in result.output
    assert "channel: acquisition channel [samples: organic, ads_google]" in result.output

    args = ["sql", "knowledge", "add-verified", "--tenant", "acme", "--dir", str(root),
            "--question", "How many whales?", "--sql", "SELECT COUNT(*) FROM players",
            "--by", "carol", "--tags", "players, spend"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "vq-acme-002" in result.output and "not validated" in result.output
    added = KnowledgeStore(root).load("acme").verified[-1]
    assert (added.question, added.verified_by, added.tags) == (
        "How many whales?",
        "carol",
        ["players", "spend"],
    )

    result = runner.invoke(
        app, ["sql", "knowledge", "show", "--tenant", "globex", "--dir", str(root)]
    )
    assert result.exit_code == 1


# --- the real knowledge tree shipped in deploy/knowledge ----------------------------

DEPLOYED = REPO / "deploy" / "knowledge"


def _tables(sql: str) -> set[str]:
    tree = sqlglot.parse_one(sql, read="mysql")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    return {t.name.lower() for t in tree.find_all(exp.Table)} - ctes


@pytest.mark.skipif(not DEPLOYED.is_dir(), reason="deploy/knowledge not written yet")
@pytest.mark.parametrize("tenant", ["acme", "nova"])
def test_deployed_knowledge_loads(tenant: str) -> None:
    store = KnowledgeStore(DEPLOYED)
    k = store.load(tenant)
    assert k.views and k.metrics and k.verified and k.semantics_sections()
    views = {v.name.lower() for v in k.views}
    for metric in k.metrics:
        sql = metric.render()
        assert "{" not in sql, metric.name
        assert _tables(sql) <= views, f"metric {metric.name} reads undocumented views"
    for q in k.verified:
        assert _tables(q.sql) <= views, f"verified {q.id} reads undocumented views"
    assert store.next_verified_id(tenant).startswith(f"vq-{tenant}-")
