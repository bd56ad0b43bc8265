"""`sy sql knowledge ...`: inspect tenant knowledge, index it, add verified queries.

The index and the embedder are imported inside the commands that need them:
torch and qdrant take seconds to import, and `sy` must start fast for every
other command.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from switchyard.cli import console, err
from switchyard.errors import SwitchyardError
from switchyard.text2sql.knowledge import KnowledgeStore, VerifiedQuery

if TYPE_CHECKING:
    from switchyard.text2sql.index import KnowledgeIndex

knowledge = typer.Typer(help="Tenant knowledge for Text2SQL: views, metrics, verified queries.")

Tenant = Annotated[str, typer.Option("--tenant", help="tenant id")]
KnowledgeDir = Annotated[
    Path | None,
    typer.Option("--dir", help="knowledge root (default: SY_KNOWLEDGE_DIR or deploy/knowledge)"),
]
IndexPath = Annotated[
    Path | None,
    typer.Option(
        "--index-path",
        help="embedded index dir (default: SY_KNOWLEDGE_INDEX or .sy/knowledge-index)",
    ),
]
Url = Annotated[str | None, typer.Option("--url", help="a Qdrant server instead of --index-path")]


def knowledge_root(given: Path | None) -> Path:
    return given or Path(os.environ.get("SY_KNOWLEDGE_DIR", "deploy/knowledge"))


def _index(index_path: Path | None, url: str | None) -> KnowledgeIndex:
    from switchyard.text2sql.index import open_index

    path = index_path or Path(os.environ.get("SY_KNOWLEDGE_INDEX", ".sy/knowledge-index"))
    return open_index(path, url)


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]{exc}[/red]")
    return typer.Exit(1)


@knowledge.command("show")
def show(tenant: Tenant, directory: KnowledgeDir = None) -> None:
    """Version, counts, and the schema text a prompt gets."""
    try:
        k = KnowledgeStore(knowledge_root(directory)).load(tenant)
    except SwitchyardError as exc:
        raise _fail(exc) from exc
    console.print(f"tenant {k.tenant}  pack {k.pack}  version {k.version}")
    console.print(
        f"{len(k.views)} views, {len(k.metrics)} metrics, {len(k.verified)} verified queries, "
        f"{len(k.semantics_sections())} semantics sections"
    )
    console.print(k.schema_text(), markup=False, highlight=False, soft_wrap=True)


@knowledge.command("index")
def index(
    tenant: Tenant, directory: KnowledgeDir = None, index_path: IndexPath = None, url: Url = None
) -> None:
    """Bring the tenant's items in the vector index up to date with its files."""
    try:
        k = KnowledgeStore(knowledge_root(directory)).load(tenant)
        ix = _index(index_path, url)
    except SwitchyardError as exc:
        raise _fail(exc) from exc
    with contextlib.closing(ix):
        written = ix.sync(k)
    console.print(f"{tenant}: version {k.version}, {written} items written")


@knowledge.command("add-verified")
def add_verified(
    tenant: Tenant,
    question: Annotated[str, typer.Option("--question", help="the question, as a user asks it")],
    sql: Annotated[str, typer.Option("--sql", help="the SQL that answers it")],
    by: Annotated[str, typer.Option("--by", help="who checked the answer")],
    tags: Annotated[str, typer.Option("--tags", help="comma-separated")] = "",
    directory: KnowledgeDir = None,
) -> None:
    """Append a verified query to the tenant's verified.yaml.

    The SQL is stored as given, not parsed or checked against the tenant's policy
    (the validator judges it whenever it is used): check it first with `sy sql check`.
    """
    store = KnowledgeStore(knowledge_root(directory))
    try:
        query = VerifiedQuery(
            id=store.next_verified_id(tenant),
            question=question,
            sql=sql,
            verified_by=by,
            verified_at=dt.datetime.now(dt.UTC).replace(microsecond=0),
            tags=[t.strip() for t in tags.split(",") if t.strip()],
        )
        store.add_verified(tenant, query)
    except (SwitchyardError, ValueError) as exc:
        raise _fail(exc) from exc
    console.print(f"added {query.id} to {tenant} (SQL stored as given, not validated)")


@knowledge.command("search")
def search(
    tenant: Tenant,
    query: Annotated[str, typer.Option("--query", help="text to look up")],
    kinds: Annotated[str, typer.Option("--kinds", help="comma-separated item kinds")] = (
        "view,semantics,metric,verified"
    ),
    limit: Annotated[int, typer.Option("--limit", min=1, max=100)] = 5,
    index_path: IndexPath = None,
    url: Url = None,
) -> None:
    """Nearest items with their scores (a debugging aid; run `index` first)."""
    from switchyard.text2sql.index import ITEM_KINDS, ItemKind

    wanted = cast(list[ItemKind], [k.strip() for k in kinds.split(",") if k.strip()])
    if unknown := set(wanted) - ITEM_KINDS:
        raise typer.BadParameter(f"unknown kinds {sorted(unknown)}; use {sorted(ITEM_KINDS)}")
    try:
        with contextlib.closing(_index(index_path, url)) as ix:
            hits = ix.search(tenant, query, kinds=wanted, limit=limit)
    except SwitchyardError as exc:
        raise _fail(exc) from exc
    if not hits:
        console.print("no hits (is the tenant indexed? `sy sql knowledge index`)")
    for hit in hits:
        text = " ".join(hit.text.split())
        line = f"{hit.score:.3f}  {hit.kind:<9} {hit.ref}  {text[:100]}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)
