"""The knowledge index on real Qdrant (embedded, on disk) with the real multilingual-e5 embedder.

The property that matters most: a search for one tenant never returns another
tenant's items, even when both hold near-identical items and the query is the
other tenant's exact text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchyard.text2sql.embedding import DIM, Embedder
from switchyard.text2sql.index import ITEM_KINDS, ItemKind, KnowledgeIndex, KnowledgeIndexError
from switchyard.text2sql.knowledge import (
    ColumnDoc,
    Metric,
    TenantKnowledge,
    VerifiedQuery,
    ViewDoc,
)

ALL: list[ItemKind] = ["view", "semantics", "metric", "verified", "answer"]
WHEN = dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)


def vq(qid: str, question: str, sql: str) -> VerifiedQuery:
    return VerifiedQuery(id=qid, question=question, sql=sql, verified_by="alice", verified_at=WHEN)


def knowledge(tenant: str, verified: list[VerifiedQuery]) -> TenantKnowledge:
    return TenantKnowledge(
        tenant=tenant,
        pack="game-ops",
        views=[
            ViewDoc(
                name="players",
                description="One row per registered player",
                columns=[ColumnDoc(name="player_id"), ColumnDoc(name="registered_at")],
            ),
            ViewDoc(
                name="agg_dau_daily",
                description="Daily active users per calendar day",
                columns=[ColumnDoc(name="day"), ColumnDoc(name="dau")],
            ),
        ],
        semantics="## Activity\nA player is active on a day when they log in.\n"
        "## Revenue\nRevenue is gross, in USD cents.\n",
        metrics=[
            Metric(
                name="dau",
                description="Daily active users",
                synonyms=["daily active users", "active players per day"],
                sql="SELECT day, dau FROM agg_dau_daily ORDER BY day DESC LIMIT {days}",
                params={"days": 7},
            )
        ],
        verified=verified,
    )


ACME = knowledge(
    "acme",
    [
        vq("vq-acme-001", "daily active users yesterday", "SELECT dau FROM acme_dau"),
        vq("vq-acme-002", "new sign-ups in the last seven days", "SELECT 2"),
        vq("vq-acme-003", "total revenue this month", "SELECT 3"),
    ],
)
NOVA = knowledge(
    "nova",
    [
        vq("vq-nova-001", "daily active users yesterday", "SELECT dau FROM nova_dau"),
        vq("vq-nova-002", "top spenders by revenue", "SELECT 4"),
    ],
)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    emb = Embedder()
    assert len(emb.encode(["warm up"])[0]) == DIM  # load once (~4 s) for the module
    return emb


@pytest.fixture
def index(embedder: Embedder, tmp_path: Path) -> Iterator[KnowledgeIndex]:
    ix = KnowledgeIndex(embedder, path=tmp_path / "index")
    yield ix
    ix.close()


def test_tenants_never_see_each_other(index: KnowledgeIndex) -> None:
    assert set(ALL) == ITEM_KINDS
    assert index.sync(ACME) == 2 + 2 + 1 + 3  # views, semantics sections, metric, verified
    assert index.sync(NOVA) == 2 + 2 + 1 + 2
    index.add("acme", "answer", "acme-q1", "who are the whales", {"sql": "SELECT 5"})
    index.add("nova", "answer", "nova-q1", "who are the whales", {"sql": "SELECT 6"})
    queries = [
        "daily active users yesterday",  # both tenants' exact text
        "top spenders by revenue",  # nova's exact text
        "who are the whales",
        "new sign-ups in the last seven days",
        "revenue",
        "",
    ]
    for query in queries:
        for tenant, other in (("acme", "nova"), ("nova", "acme")):
            hits = index.search(tenant, query, kinds=ALL, limit=50)
            assert hits, (tenant, query)
            assert all(h.payload["tenant"] == tenant for h in hits), (tenant, query)
            assert not any(other in str(h.payload) for h in hits), (tenant, query)
    [top] = index.search("acme", "daily active users yesterday", kinds=["verified"], limit=1)
    assert (top.ref, top.payload["sql"]) == ("vq-acme-001", "SELECT dau FROM acme_dau")
    assert top.score > 0.99
    [top] = index.search("nova", "who are the whales", kinds=["answer"], limit=1)
    assert top.payload["sql"] == "SELECT 6"


def test_paraphrase_finds_the_verified_query(index: KnowledgeIndex) -> None:
    index.sync(ACME)
    hits = index.search("acme", "how many players were active yesterday", kinds=["verified"])
    scores = [(h.ref, round(h.score, 3)) for h in hits]
    assert hits[0].ref == "vq-acme-001", scores
    assert hits[0].score > hits[1].score, scores
    [metric] = index.search("acme", "active players per day", kinds=["metric"], limit=1)
    assert metric.payload["name"] == "dau"
    kinds = {h.kind for h in index.search("acme", "players", kinds=["view", "semantics"])}
    assert kinds == {"view", "semantics"}
    assert index.search("acme", "players", kinds=["verified"], min_score=0.999) == []


def test_sync_is_idempotent_and_follows_edits(index: KnowledgeIndex) -> None:
    assert index.sync(ACME) == 8
    assert index.sync(ACME) == 0
    index.sync(NOVA)
    index.add("acme", "answer", "a1", "daily active users yesterday", {"sql": "SELECT 9"})

    edited = ACME.model_copy(
        update={
            "verified": [ACME.verified[0], vq("vq-acme-002", "new players per day", "SELECT 7")]
        }
    )
    # one changed verified query re-embedded, one removed; nothing else rewritten
    assert index.sync(edited) == 2
    refs = {h.ref for h in index.search("acme", "revenue", kinds=["verified"], limit=50)}
    assert refs == {"vq-acme-001", "vq-acme-002"}
    [hit] = index.search("acme", "new players per day", kinds=["verified"], limit=1)
    assert hit.payload["sql"] == "SELECT 7"
    # sync never touches answers or other tenants
    assert [h.ref for h in index.search("acme", "x", kinds=["answer"])] == ["a1"]
    assert len(index.search("nova", "x", kinds=["verified"], limit=50)) == 2


def test_add_cannot_override_reserved_keys(index: KnowledgeIndex) -> None:
    index.add("acme", "answer", "a1", "whales", {"sql": "SELECT 1", "tenant": "nova"})
    [answer] = index.search("acme", "whales", kinds=["answer"])
    assert answer.payload["tenant"] == "acme"
    assert index.search("nova", "whales", kinds=["answer"]) == []


def test_survives_reopen_and_rejects_bad_arguments(embedder: Embedder, tmp_path: Path) -> None:
    path = tmp_path / "index"
    ix = KnowledgeIndex(embedder, path=path)
    ix.sync(ACME)
    ix.close()
    ix = KnowledgeIndex(embedder, path=path)
    try:
        assert ix.sync(ACME) == 0  # the version marker persisted
        for bad in ("../acme", "ACME", "", "acme\x00"):
            with pytest.raises(KnowledgeIndexError):
                ix.search(bad, "x", kinds=ALL)
        with pytest.raises(KnowledgeIndexError):
            ix.search("acme", "x", kinds="verified")  # type: ignore[arg-type]
        with pytest.raises(KnowledgeIndexError):
            ix.search("acme", "x", kinds=["_version"])  # type: ignore[list-item]
        assert ix.search("acme", "x", kinds=[]) == []
    finally:
        ix.close()


class _OtherModel(Embedder):
    """The real embedder under another model's name: what an index built by an earlier
    model (all-MiniLM-L6-v2, before multilingual-e5) looks like to this one."""

    name = "an-earlier-model"


def test_vectors_of_another_model_are_re_embedded_and_never_compared(
    embedder: Embedder, tmp_path: Path
) -> None:
    path = tmp_path / "index"
    old = KnowledgeIndex(_OtherModel(), path=path)
    assert old.sync(ACME) == 8
    old.add("acme", "answer", "acme-q1", "who are the whales", {"sql": "SELECT 5"})
    old.close()
    index = KnowledgeIndex(embedder, path=path)
    try:
        # The old model's answer-cache item is no hit for the new one...
        assert index.search("acme", "who are the whales", kinds=["answer"]) == []
        # ... and a sync of the same knowledge version re-embeds every synced item.
        assert index.sync(ACME) == 8
        assert index.sync(ACME) == 0
        hits = index.search("acme", "daily active users yesterday", kinds=ALL, limit=50)
        assert hits and all(h.payload["embedder"] == embedder.name for h in hits)
    finally:
        index.close()


def test_chinese_questions_find_their_english_twins(index: KnowledgeIndex) -> None:
    index.sync(ACME)
    for asked, ref in (
        ("昨天的日活跃用户", "vq-acme-001"),
        ("最近七天的新注册用户", "vq-acme-002"),
        ("这个月的总收入", "vq-acme-003"),
    ):
        [top] = index.search("acme", asked, kinds=["verified"], limit=1)
        assert top.ref == ref, (asked, top)
