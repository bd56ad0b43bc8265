"""A tenant's Text2SQL knowledge: documented views, semantics, metrics, verified queries.

Layout under the knowledge root (default `deploy/knowledge`):

    packs/<pack>/schema.yaml       views and their columns (descriptions, sample values)
    packs/<pack>/semantics.md      business meaning, in `## ` sections
    packs/<pack>/metrics.yaml      named, parameterised SQL for common questions
    packs/<pack>/terms.yaml        what questions are about, in every language's words
    tenants/<tenant>/knowledge.yaml   `pack: <pack>` and optional `notes: ...`
    tenants/<tenant>/verified.yaml    question -> SQL pairs a human has checked

A pack is shared by tenants running the same product; what differs per tenant
(notes, verified queries) lives under the tenant. SQL uses unqualified view names,
which the tenant's policy `database` resolves, so one pack serves every tenant.

Models are strict (unknown keys are refused) so a misspelt key fails at load time
with the file and field named, instead of silently dropping knowledge.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    model_validator,
)

from switchyard.errors import ErrorCode, SwitchyardError
from switchyard.sqlguard.policy import AllowedTable, Policy

TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_PARAM = r"[a-z_][a-z0-9_]{0,63}"
_PLACEHOLDER = re.compile(r"\{(" + _PARAM + r")\}")

# Same subset the SQL policy accepts for object names: anything else is a typo.
ObjectName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_$]{1,64}$")]
MetricName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
QueryId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
PackName = Annotated[str, StringConstraints(pattern=TENANT_RE.pattern)]
NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def _scalar_strings(value: Any) -> Any:
    """YAML reads `samples: [1, yes, 2026-01-01]` as int/bool/date; they are text to us."""
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    for item in value:
        if isinstance(item, bool):
            out.append("true" if item else "false")
        elif isinstance(item, int | float | dt.date):
            out.append(item.isoformat() if isinstance(item, dt.date) else str(item))
        else:
            out.append(item)
    return out


Samples = Annotated[list[str], BeforeValidator(_scalar_strings)]


class KnowledgeError(SwitchyardError):
    """Unknown tenant (`unknown_tenant`) or an unusable knowledge file (`invalid_request`)."""

    code: ErrorCode = "invalid_request"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnDoc(_Strict):
    name: ObjectName
    description: str = ""
    samples: Samples = []


class ViewDoc(_Strict):
    name: ObjectName
    description: str = ""
    columns: list[ColumnDoc]


class Metric(_Strict):
    name: MetricName
    description: NonEmpty
    synonyms: list[str] = []
    sql: NonEmpty
    params: dict[Annotated[str, StringConstraints(pattern=f"^{_PARAM}$")], StrictInt] = {}

    @model_validator(mode="after")
    def _placeholders_match_params(self) -> Metric:
        # Both directions: an unfilled `{x}` would reach the database, and a param
        # the SQL never uses is almost always a misspelling of one it does.
        used = set(_PLACEHOLDER.findall(self.sql))
        if missing := used - set(self.params):
            raise ValueError(f"sql uses {sorted(missing)} with no default in params")
        if unused := set(self.params) - used:
            raise ValueError(f"params {sorted(unused)} do not appear in sql")
        return self

    def render(self, **overrides: int) -> str:
        """The SQL with `{param}` filled; only declared params, only integers.

        Integers only, so nothing a caller passes can change the statement's shape.
        """
        if unknown := set(overrides) - set(self.params):
            raise KnowledgeError(f"metric {self.name}: unknown params {sorted(unknown)}")
        for key, value in overrides.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise KnowledgeError(f"metric {self.name}: param {key} must be an integer")
        values = {**self.params, **overrides}
        return _PLACEHOLDER.sub(lambda m: str(int(values[m.group(1)])), self.sql)


class Term(_Strict):
    """Something a question can be about, in the words (any language) that name it."""

    name: MetricName
    phrases: Annotated[list[NonEmpty], Field(min_length=1)]


class VerifiedQuery(_Strict):
    id: QueryId
    question: NonEmpty
    sql: NonEmpty
    verified_by: NonEmpty
    verified_at: dt.datetime
    tags: list[str] = []


class TenantKnowledge(_Strict):
    tenant: str
    pack: str
    views: list[ViewDoc]
    semantics: str
    metrics: list[Metric]
    verified: list[VerifiedQuery]
    terms: list[Term] = []

    # Computed on every call, not cached: `model_copy(update=...)` would carry a stale one.
    @property
    def version(self) -> str:
        body = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def view(self, name: str) -> ViewDoc | None:
        lowered = name.lower()
        return next((v for v in self.views if v.name.lower() == lowered), None)

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)

    def restricted_to(self, policy: Policy) -> TenantKnowledge:
        """Only the views and columns `policy` lets this tenant read.

        Metrics and verified queries stay: the SQL validator judges their SQL, and
        dropping them here would hide knowledge without making anything safer.
        """
        allowed = policy.allowed
        views: list[ViewDoc] = []
        for view in self.views:
            grants = _grants_for(view.name, policy.database, allowed)
            if not grants:
                continue
            columns = [c for c in view.columns if any(g.allows(c.name) for g in grants)]
            if columns:
                views.append(view.model_copy(update={"columns": columns}))
        return self.model_copy(update={"views": views})

    def schema_text(self, views: Sequence[str] | None = None) -> str:
        """Compact prompt text, in pack order whatever order `views` names them in.

        players: One row per registered player
          channel: acquisition channel [samples: organic, ads_google]
        """
        wanted = None if views is None else {v.lower() for v in views}
        lines: list[str] = []
        for view in self.views:
            if wanted is not None and view.name.lower() not in wanted:
                continue
            lines.append(_line(view.name, view.description))
            for col in view.columns:
                line = "  " + _line(col.name, col.description)
                if col.samples:
                    line += f" [samples: {', '.join(_flat(s) for s in col.samples)}]"
                lines.append(line)
        return "\n".join(lines)

    def semantics_sections(self) -> list[tuple[str, str]]:
        """(heading, body) per `## ` section; text before the first heading gets heading ""."""
        return split_sections(self.semantics)


def _grants_for(
    view: str, database: str | None, allowed: dict[tuple[str, str], AllowedTable]
) -> list[AllowedTable]:
    # SQL names views unqualified, so they resolve in the policy's `database`; with
    # no database set, any schema's grant for that view name is the one it reaches.
    name = view.lower()
    if database is not None:
        grant = allowed.get((database.lower(), name))
        return [grant] if grant else []
    return [g for (_, table), g in allowed.items() if table == name]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _line(name: str, description: str) -> str:
    flat = _flat(description)
    return f"{name}: {flat}" if flat else name


def split_sections(markdown: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, str]] = []
    heading = ""
    body: list[str] = []
    for line in markdown.splitlines():
        if line.startswith("## "):
            if heading or "".join(body).strip():
                sections.append((heading, "\n".join(body).strip()))
            heading, body = line[3:].strip(), []
        else:
            body.append(line)
    if heading or "".join(body).strip():
        sections.append((heading, "\n".join(body).strip()))
    return sections


_M = TypeVar("_M", bound=BaseModel)


# --- file models: the on-disk shapes, converted into the models above -------------


class _ColumnFile(_Strict):
    description: str = ""
    samples: Samples = []


class _ViewFile(_Strict):
    description: str = ""
    columns: dict[ObjectName, _ColumnFile | None] = Field(min_length=1)


class _SchemaFile(_Strict):
    views: dict[ObjectName, _ViewFile] = Field(min_length=1)


class _MetricsFile(_Strict):
    metrics: list[Metric] = []

    @model_validator(mode="after")
    def _unique(self) -> _MetricsFile:
        _no_duplicates([m.name for m in self.metrics], "metric name")
        return self


class _TermsFile(_Strict):
    terms: list[Term] = []

    @model_validator(mode="after")
    def _unique(self) -> _TermsFile:
        _no_duplicates([t.name for t in self.terms], "term")
        return self


class _VerifiedFile(_Strict):
    queries: list[VerifiedQuery] = []

    @model_validator(mode="after")
    def _unique(self) -> _VerifiedFile:
        _no_duplicates([q.id for q in self.queries], "query id")
        return self


class _TenantFile(_Strict):
    pack: PackName
    notes: str = ""


def _no_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} {name!r}")
        seen.add(name)


def _read_yaml(path: Path, required: bool = True) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if not required:
            return {}
        raise KnowledgeError(f"{path}: missing") from exc
    except OSError as exc:
        raise KnowledgeError(f"{path}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KnowledgeError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise KnowledgeError(f"{path}: must be a YAML mapping")
    return data


def _load(model: type[_M], path: Path, required: bool = True) -> _M:
    """The YAML file at `path` as a `model`; an absent file that is not `required` as {}."""
    try:
        return model.model_validate(_read_yaml(path, required))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise KnowledgeError(f"{path}: {problems}") from exc


# --- the store --------------------------------------------------------------------

# (path, inode, mtime_ns, size); None for a file that does not exist.
_Signature = tuple[tuple[str, int, int, int] | None, ...]


def _stat(path: Path) -> tuple[str, int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (str(path), st.st_ino, st.st_mtime_ns, st.st_size)


class KnowledgeStore:
    """Tenants' knowledge under `root`, cached and re-read when any of its files change.

    The check is a stat per file on every `load`, so an edit (by `sy sql knowledge
    add-verified`, or by hand) is seen by a running process without a restart.
    The inode is part of the signature because writers replace files atomically.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, tuple[_Signature, TenantKnowledge]] = {}
        self._lock = threading.Lock()

    def load(self, tenant: str) -> TenantKnowledge:
        tdir = self._tenant_dir(tenant)
        tenant_file = tdir / "knowledge.yaml"
        if not tenant_file.is_file():
            raise KnowledgeError(f"no knowledge for tenant {tenant!r}", code="unknown_tenant")
        with self._lock:
            cached = self._cache.get(tenant)
        if cached and self._signature(tdir, cached[1].pack) == cached[0]:
            return cached[1]
        # Stat before reading: an edit landing mid-read then shows up as a changed
        # signature on the next load instead of being cached as current.
        first = _stat(tenant_file)
        config = _load(_TenantFile, tenant_file)
        signature = (first, *self._signature(tdir, config.pack)[1:])
        knowledge = self._read(tenant, tdir, config)
        with self._lock:
            self._cache[tenant] = (signature, knowledge)
        return knowledge

    def add_verified(self, tenant: str, query: VerifiedQuery) -> None:
        with self._locked(tenant) as path:
            current = self._verified(path)
            if any(q.id == query.id for q in current):
                raise KnowledgeError(f"{path}: query id {query.id!r} already exists")
            self._write_verified(path, [*current, query])

    def remove_verified(self, tenant: str, query_id: str) -> bool:
        with self._locked(tenant) as path:
            current = self._verified(path)
            kept = [q for q in current if q.id != query_id]
            if len(kept) == len(current):
                return False
            self._write_verified(path, kept)
            return True

    def next_verified_id(self, tenant: str) -> str:
        # Ids only need to be unique within the tenant's file, so a long tenant
        # name is shortened to keep the id within its 64 characters.
        prefix = f"vq-{tenant[:50]}-"
        taken = [q.id[len(prefix) :] for q in self.load(tenant).verified if q.id.startswith(prefix)]
        numbers = [int(t) for t in taken if t.isdigit()]
        return f"{prefix}{max(numbers, default=0) + 1:03d}"

    # --- internals ---

    def _tenant_dir(self, tenant: str) -> Path:
        # The pattern alone keeps a tenant id from naming anything outside the root.
        if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
            raise KnowledgeError(f"invalid tenant name {tenant!r}")
        return self.root / "tenants" / tenant

    def _pack_dir(self, pack: str) -> Path:
        return self.root / "packs" / pack

    def _signature(self, tdir: Path, pack: str) -> _Signature:
        pdir = self._pack_dir(pack)
        return tuple(
            _stat(p)
            for p in (
                tdir / "knowledge.yaml",
                tdir / "verified.yaml",
                pdir / "schema.yaml",
                pdir / "semantics.md",
                pdir / "metrics.yaml",
                pdir / "terms.yaml",
            )
        )

    def _read(self, tenant: str, tdir: Path, config: _TenantFile) -> TenantKnowledge:
        pdir = self._pack_dir(config.pack)
        if not pdir.is_dir():
            raise KnowledgeError(f"{tdir / 'knowledge.yaml'}: pack: no pack {config.pack!r}")
        schema = _load(_SchemaFile, pdir / "schema.yaml")
        metrics = _load(_MetricsFile, pdir / "metrics.yaml", required=False)
        terms = _load(_TermsFile, pdir / "terms.yaml", required=False)
        try:
            semantics = (pdir / "semantics.md").read_text(encoding="utf-8")
        except FileNotFoundError:
            semantics = ""
        except OSError as exc:
            raise KnowledgeError(f"{pdir / 'semantics.md'}: cannot read: {exc}") from exc
        if config.notes.strip():
            notes = config.notes.strip()
            if not notes.startswith("## "):
                notes = f"## Notes for {tenant}\n\n{notes}"
            semantics = f"{semantics.rstrip()}\n\n{notes}\n".lstrip()
        views = [
            ViewDoc(
                name=name,
                description=view.description,
                columns=[
                    ColumnDoc(name=col, **(doc.model_dump() if doc else {}))
                    for col, doc in view.columns.items()
                ],
            )
            for name, view in schema.views.items()
        ]
        return TenantKnowledge(
            tenant=tenant,
            pack=config.pack,
            views=views,
            semantics=semantics,
            metrics=metrics.metrics,
            verified=self._verified(tdir / "verified.yaml"),
            terms=terms.terms,
        )

    def _verified(self, path: Path) -> list[VerifiedQuery]:
        return _load(_VerifiedFile, path, required=False).queries

    @contextmanager
    def _locked(self, tenant: str) -> Iterator[Path]:
        """verified.yaml of `tenant`, under an exclusive lock for read-modify-write.

        flock on the tenant directory itself, so two processes (a CLI and a service)
        cannot interleave their rewrites and no lock file is left in the tree.
        """
        tdir = self._tenant_dir(tenant)
        if not (tdir / "knowledge.yaml").is_file():
            raise KnowledgeError(f"no knowledge for tenant {tenant!r}", code="unknown_tenant")
        fd = os.open(tdir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield tdir / "verified.yaml"
        finally:
            os.close(fd)  # closing releases the lock

    @staticmethod
    def _write_verified(path: Path, queries: list[VerifiedQuery]) -> None:
        # Rewritten whole (comments in the file are not kept), then swapped in with
        # os.replace so a reader sees either the old file or the new one, never half.
        body = yaml.safe_dump(
            {"queries": [q.model_dump(mode="json") for q in queries]},
            sort_keys=False,
            allow_unicode=True,
            width=100,
        )
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verified.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
