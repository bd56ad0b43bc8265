"""The tenant knowledge index: every tenant's items in one Qdrant collection.

Isolation is by payload, so it rests on one rule: `search` is the only method that
returns stored items, and it always filters on `tenant == X` (and re-checks the
payload of every hit, in case a filter were ever built wrong). Point ids are
UUID5 of (tenant, kind, ref), so the same item of two tenants can never collide
and a re-sync overwrites instead of duplicating.

`sync` keeps a marker point per tenant holding the knowledge version and the
embedding model it indexed with; when both match, sync is a no-op. Otherwise only
items whose text or payload changed (or that another model embedded) are
re-embedded, and items no longer in the knowledge are deleted. Searches compare
vectors of the current model only.
"answer" items (the semantic answer cache) are written by `add` and never
touched by `sync`: they carry the knowledge version they were made under, and
their owner decides when they are stale.

Local mode (`path=`) is Qdrant's embedded engine: one process at a time may
open a directory. Several processes share an index through a server (`url=`).
The client is synchronous; async callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from qdrant_client import QdrantClient, models

from switchyard.errors import ErrorCode, SwitchyardError
from switchyard.text2sql.embedding import DIM, Embedder, Role, shared_embedder
from switchyard.text2sql.knowledge import TENANT_RE, TenantKnowledge

ItemKind = Literal["view", "semantics", "metric", "verified", "answer"]
ITEM_KINDS: frozenset[str] = frozenset(get_args(ItemKind))
# What `sync` owns; "answer" items belong to the answer cache.
SYNCED_KINDS: tuple[ItemKind, ...] = ("view", "semantics", "metric", "verified")
_MARKER_KIND = "_version"  # not an ItemKind, so no search can ever return it
_RESERVED = ("tenant", "kind", "ref", "text", "embedder")
_ID_NAMESPACE = uuid.UUID("5f0c6a3e-8f7d-4f35-9b8e-0d6c1b7e2a41")
_BATCH = 64
QUERY_CACHE = 64  # question vectors kept
# How each kind is embedded: questions as queries (matched against the question
# asked: symmetric), documents as the passages a question retrieves.
_ROLE: dict[str, Role] = {"verified": "query", "answer": "query", "view": "passage",
                          "semantics": "passage", "metric": "passage"}  # fmt: skip


class KnowledgeIndexError(SwitchyardError):
    """A bad argument to the index (tenant name, kind) or an unusable collection."""

    code: ErrorCode = "invalid_request"


@dataclass(frozen=True)
class Hit:
    kind: ItemKind
    ref: str
    text: str
    score: float
    payload: dict[str, Any]


@dataclass(frozen=True)
class _Item:
    kind: ItemKind
    ref: str
    text: str
    payload: dict[str, Any]


def point_id(tenant: str, kind: str, ref: str) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"{tenant}\x00{kind}\x00{ref}"))


def items_for(knowledge: TenantKnowledge) -> list[_Item]:
    """The items `sync` indexes for one tenant, with the text each is embedded by."""
    items: list[_Item] = []
    for view in knowledge.views:
        cols = ", ".join(
            f"{c.name} ({' '.join(c.description.split())})" if c.description.strip() else c.name
            for c in view.columns
        )
        text = f"view {view.name}: {' '.join(view.description.split())}; columns: {cols}"
        items.append(_Item("view", view.name, text, {"name": view.name}))
    seen: dict[str, int] = {}
    for heading, body in knowledge.semantics_sections():
        # Headings can repeat (a tenant note reusing a pack heading); refs must not.
        seen[heading] = seen.get(heading, 0) + 1
        ref = heading if seen[heading] == 1 else f"{heading}#{seen[heading]}"
        text = f"{heading}\n{body}".strip()
        items.append(_Item("semantics", ref, text, {"heading": heading}))
    for metric in knowledge.metrics:
        text = f"{metric.name.replace('_', ' ')}: {metric.description}"
        if metric.synonyms:
            text += f"; also called: {', '.join(metric.synonyms)}"
        payload = {"name": metric.name, "sql": metric.sql, "params": dict(metric.params)}
        items.append(_Item("metric", metric.name, text, payload))
    for query in knowledge.verified:
        payload = {"id": query.id, "sql": query.sql, "tags": list(query.tags)}
        items.append(_Item("verified", query.id, query.question, payload))
    return items


def _check_tenant(tenant: str) -> None:
    if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
        raise KnowledgeIndexError(f"invalid tenant name {tenant!r}")


def _check_kinds(kinds: Sequence[str]) -> None:
    if isinstance(kinds, str):  # "verified" would otherwise read as 8 one-letter kinds
        raise KnowledgeIndexError("kinds must be a sequence of kinds, not a string")
    if unknown := set(kinds) - ITEM_KINDS:
        raise KnowledgeIndexError(f"unknown item kinds {sorted(unknown)}")


def _tenant_filter(tenant: str, kinds: Sequence[str], embedder: str | None = None) -> models.Filter:
    must = [
        models.FieldCondition(key="tenant", match=models.MatchValue(value=tenant)),
        models.FieldCondition(key="kind", match=models.MatchAny(any=list(kinds))),
    ]
    if embedder is not None:  # vectors of another model are not comparable with ours
        must.append(models.FieldCondition(key="embedder", match=models.MatchValue(value=embedder)))
    return models.Filter(must=must)


class KnowledgeIndex:
    def __init__(
        self,
        embedder: Embedder,
        *,
        path: Path | None = None,
        url: str | None = None,
        location: str | None = None,
        collection: str = "sy_knowledge",
    ) -> None:
        """Exactly one of `path` (embedded, on disk), `url` (a server) or
        `location=":memory:"` (embedded, in memory: tests)."""
        if sum(x is not None for x in (path, url, location)) != 1:
            raise KnowledgeIndexError("give exactly one of path, url or location")
        self._embedder = embedder
        self._collection = collection
        self._lock = threading.Lock()
        # One question is searched several times (verified, metric, views, semantics,
        # examples): embed it once. Small, so it holds only the questions in flight.
        self._queries: OrderedDict[str, list[float]] = OrderedDict()
        self._queries_lock = threading.Lock()
        try:
            if path is not None:
                path.mkdir(parents=True, exist_ok=True)
                self._client = QdrantClient(path=str(path))
            elif url is not None:
                self._client = QdrantClient(url=url)
            else:
                self._client = QdrantClient(location=location)
        except RuntimeError as exc:  # embedded storage already open in another process
            raise KnowledgeIndexError(f"cannot open the knowledge index: {exc}") from exc
        self._ensure_collection(server=url is not None)

    def _ensure_collection(self, *, server: bool) -> None:
        if self._client.collection_exists(self._collection):
            params = self._client.get_collection(self._collection).config.params.vectors
            size = params.size if isinstance(params, models.VectorParams) else None
            if size != DIM:
                raise KnowledgeIndexError(
                    f"collection {self._collection} holds {size}-dimensional vectors, "
                    f"the embedder makes {DIM}: use another collection or delete it"
                )
            return
        self._client.create_collection(
            self._collection,
            vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE),
        )
        if server:  # embedded mode ignores payload indexes (and warns about them)
            self._client.create_payload_index(
                self._collection,
                "tenant",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            )
            self._client.create_payload_index(
                self._collection, "kind", models.PayloadSchemaType.KEYWORD
            )

    def sync(self, knowledge: TenantKnowledge) -> int:
        """Make the tenant's synced items match `knowledge`; the number of items
        upserted plus deleted (0 when this version is already indexed)."""
        tenant = knowledge.tenant
        _check_tenant(tenant)
        version = knowledge.version
        marker_id = point_id(tenant, _MARKER_KIND, "")
        wanted = items_for(knowledge)
        ids = [point_id(tenant, i.kind, i.ref) for i in wanted]
        with self._lock:
            marker = self._client.retrieve(self._collection, [marker_id], with_payload=True)
            mark = marker[0].payload or {} if marker else {}
            if mark.get("version") == version and mark.get("embedder") == self._embedder.name:
                return 0
            existing = {
                str(r.id): r.payload or {}
                for chunk in _chunks(ids)
                for r in self._client.retrieve(self._collection, chunk, with_payload=True)
            }
            changed = [
                (pid, item)
                for pid, item in zip(ids, wanted, strict=True)
                if existing.get(pid) != self._payload(tenant, item)
            ]
            stale = models.Filter(
                must=_tenant_filter(tenant, SYNCED_KINDS).must,
                must_not=[models.HasIdCondition(has_id=list(ids))],
            )
            removed = self._client.count(self._collection, count_filter=stale, exact=True).count
            if removed:
                self._client.delete(self._collection, models.FilterSelector(filter=stale))
        # Embed outside the lock: it is the slow part, and searches may go on meanwhile.
        for chunk in _chunks(changed):
            points = [
                models.PointStruct(id=pid, vector=vec, payload=self._payload(tenant, item))
                for pid, item, vec in self._embedded(chunk)
            ]
            with self._lock:
                self._client.upsert(self._collection, points)
        # The marker goes last, so a sync cut short is redone by the next call.
        marker_point = models.PointStruct(
            id=marker_id,
            vector=[1.0] + [0.0] * (DIM - 1),  # any unit vector: it is never searched
            payload={
                "tenant": tenant,
                "kind": _MARKER_KIND,
                "version": version,
                "embedder": self._embedder.name,
            },
        )
        with self._lock:
            self._client.upsert(self._collection, [marker_point])
        return len(changed) + removed

    def add(
        self, tenant: str, kind: ItemKind, ref: str, text: str, payload: dict[str, Any]
    ) -> None:
        """Upsert one item; `tenant`, `kind`, `ref` and `text` in `payload` are overwritten."""
        _check_tenant(tenant)
        _check_kinds([kind])
        item = _Item(kind, ref, text, dict(payload))
        [vector] = self._embedder.encode([text], _ROLE[kind])
        point = models.PointStruct(
            id=point_id(tenant, kind, ref), vector=vector, payload=self._payload(tenant, item)
        )
        with self._lock:
            self._client.upsert(self._collection, [point])

    def search(
        self,
        tenant: str,
        query: str,
        *,
        kinds: Sequence[ItemKind],
        limit: int = 5,
        min_score: float = 0.0,
    ) -> list[Hit]:
        """The tenant's items of `kinds` nearest to `query`, best first (cosine score)."""
        _check_tenant(tenant)
        _check_kinds(kinds)
        if not kinds or limit < 1:
            return []
        vector = self._query_vector(query)
        with self._lock:
            found = self._client.query_points(
                self._collection,
                query=vector,
                query_filter=_tenant_filter(tenant, kinds, self._embedder.name),
                limit=limit,
                score_threshold=min_score,
                with_payload=True,
            ).points
        hits: list[Hit] = []
        for point in found:
            payload = point.payload or {}
            # Belt and braces: the filter already did this, a wrong filter must not leak.
            if payload.get("tenant") != tenant or payload.get("kind") not in kinds:
                continue
            if payload.get("embedder") != self._embedder.name:
                continue
            hits.append(
                Hit(
                    kind=payload["kind"],
                    ref=str(payload.get("ref", "")),
                    text=str(payload.get("text", "")),
                    score=float(point.score),
                    payload=payload,
                )
            )
        return hits

    def _query_vector(self, query: str) -> list[float]:
        with self._queries_lock:
            if (cached := self._queries.get(query)) is not None:
                self._queries.move_to_end(query)
                return cached
        [vector] = self._embedder.encode([query], "query")
        with self._queries_lock:
            self._queries[query] = vector
            while len(self._queries) > QUERY_CACHE:
                self._queries.popitem(last=False)
        return vector

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def _embedded(self, chunk: Sequence[tuple[str, _Item]]) -> list[tuple[str, _Item, list[float]]]:
        """The chunk's items with their vectors, each embedded in its kind's role."""
        out: list[tuple[str, _Item, list[float]]] = []
        for role in ("query", "passage"):
            same = [(pid, item) for pid, item in chunk if _ROLE[item.kind] == role]
            vectors = self._embedder.encode([item.text for _, item in same], role)
            out += [(pid, item, vec) for (pid, item), vec in zip(same, vectors, strict=True)]
        return out

    def _payload(self, tenant: str, item: _Item) -> dict[str, Any]:
        body = {k: v for k, v in item.payload.items() if k not in _RESERVED}
        fixed = {"tenant": tenant, "kind": item.kind, "ref": item.ref, "text": item.text}
        return {**body, **fixed, "embedder": self._embedder.name}


def open_index(path: Path, url: str | None = None) -> KnowledgeIndex:
    """The index on the Qdrant server at `url`, else the embedded one at `path`."""
    if url:
        return KnowledgeIndex(shared_embedder(), url=url)
    return KnowledgeIndex(shared_embedder(), path=path)


_T = TypeVar("_T")


def _chunks(items: Sequence[_T]) -> list[Sequence[_T]]:
    return [items[i : i + _BATCH] for i in range(0, len(items), _BATCH)]
