"""The append-only audit table's hash chain: schema, link hashing, verification, queries.

How the chain stays consistent with any number of auditor replicas, through an
INSERT-only account (which can read nothing, so it cannot know the previous
row's hash itself):

- the auditor computes, per event, the canonical JSON `body` of what it stores
  and `content_hash = sha256(body)`, and INSERT IGNOREs the row;
- a BEFORE INSERT trigger, defined by the provisioning admin (so it runs with
  the definer's rights, not the auditor's), locks the tenant's row in
  `sql_audit_head` (`INSERT .. ON DUPLICATE KEY UPDATE` takes the row lock),
  assigns `seq = head.seq + 1`, `prev_hash = head.last_hash` and
  `row_hash = sha256(prev_hash:seq:tenant:content_hash)`, and advances the head.
  The row lock serializes writers of one tenant until their transaction
  commits, whichever replica they run in; a rolled back batch rolls the head
  back with it. Writers insert their batch sorted by tenant, so two replicas
  take head locks in the same order (no lock-order deadlock; a deadlock or
  lock timeout anyway just fails the batch, which is retried);
- a redelivered event (same `event_id`) finds its row already there: the
  trigger leaves the head alone and the unique key on `event_id` makes the
  INSERT IGNORE skip it, so it is stored once and the chain has no hole.

`verify` (with a read account) walks each tenant's rows by `seq` and reports
the first broken link: a gap, a wrong `prev_hash`, a `row_hash` or
`content_hash` that does not recompute, a column that disagrees with the
stored body, or a head that does not match the last row (a cut tail).
Someone holding root can still rewrite a whole tail consistently; anchoring
heads outside the database is what would catch that.
"""

# ruff: noqa: S608 - identifiers come from settings-validated names, quoted; values are bound

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from switchyard.sqldb.admin import quote_name as q

AUDIT_TABLE = "sql_audit"
HEAD_TABLE = "sql_audit_head"
TRIGGER = "sql_audit_chain"
GENESIS = "0" * 64

# Columns the chain needs, added to the table `provision` creates (idempotently).
CHAIN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "VARCHAR(64) NULL"),
    ("kind", "VARCHAR(64) NULL"),
    ("detail", "JSON NULL"),
    ("trace", "VARCHAR(64) NULL"),
    ("seq", "BIGINT NULL"),
    ("prev_hash", "CHAR(64) NULL"),
    ("row_hash", "CHAR(64) NULL"),
    ("content_hash", "CHAR(64) NULL"),
    ("body", "MEDIUMTEXT NULL"),
)
CHAIN_KEYS: tuple[tuple[str, str], ...] = (
    ("uniq_event", "UNIQUE KEY uniq_event (event_id)"),
    ("uniq_tenant_seq", "UNIQUE KEY uniq_tenant_seq (tenant, seq)"),
)
# Columns stored both as a column (for queries) and in the hashed body.
MIRRORED = (
    "event_id", "request_id", "tenant", "kind", "event", "actor", "verdict", "rule",
    "sql_text", "question",
)  # fmt: skip


def canonical(record: dict[str, Any]) -> str:
    """The exact text hashed and stored as `body`."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def link_hash(prev_hash: str, seq: int, tenant: str, content: str) -> str:
    """Must equal the trigger's SHA2(CONCAT(prev, ':', seq, ':', tenant, ':', content), 256)."""
    return hashlib.sha256(f"{prev_hash}:{seq}:{tenant}:{content}".encode()).hexdigest()


def trigger_sql(db: str) -> str:
    t, h = f"{q(db)}.{q(AUDIT_TABLE)}", f"{q(db)}.{q(HEAD_TABLE)}"
    return f"""CREATE TRIGGER {q(db)}.{q(TRIGGER)} BEFORE INSERT ON {t} FOR EACH ROW
BEGIN
  DECLARE v_seq BIGINT;
  DECLARE v_prev CHAR(64);
  IF NEW.event_id IS NOT NULL AND NEW.content_hash IS NOT NULL THEN
    INSERT INTO {h} (tenant, seq, last_hash) VALUES (NEW.tenant, 0, '{GENESIS}')
      ON DUPLICATE KEY UPDATE seq = seq;
    SELECT seq, last_hash INTO v_seq, v_prev FROM {h} WHERE tenant = NEW.tenant FOR UPDATE;
    IF NOT EXISTS (SELECT 1 FROM {t} WHERE event_id = NEW.event_id) THEN
      SET v_seq = v_seq + 1;
      SET NEW.seq = v_seq;
      SET NEW.prev_hash = v_prev;
      SET NEW.row_hash = SHA2(CONCAT(v_prev, ':', v_seq, ':', NEW.tenant, ':',
                                     NEW.content_hash), 256);
      UPDATE {h} SET seq = v_seq, last_hash = NEW.row_hash WHERE tenant = NEW.tenant;
    ELSE
      SET NEW.seq = NULL;
    END IF;
  END IF;
END"""


def ensure_chain_schema(conn: Any, db: str) -> None:
    """Extend the audit table (created by `provision_auditor`) for the chain; idempotent."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (db, AUDIT_TABLE),
        )
        have = {str(r[0]).lower() for r in cur.fetchall()}
        for name, ddl in CHAIN_COLUMNS:
            if name not in have:
                cur.execute(f"ALTER TABLE {q(db)}.{q(AUDIT_TABLE)} ADD COLUMN {q(name)} {ddl}")
        cur.execute(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (db, AUDIT_TABLE),
        )
        keys = {str(r[0]).lower() for r in cur.fetchall()}
        for name, ddl in CHAIN_KEYS:
            if name not in keys:
                cur.execute(f"ALTER TABLE {q(db)}.{q(AUDIT_TABLE)} ADD {ddl}")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {q(db)}.{q(HEAD_TABLE)} ("
            "tenant VARCHAR(64) NOT NULL PRIMARY KEY, seq BIGINT NOT NULL, "
            "last_hash CHAR(64) NOT NULL) ENGINE=InnoDB"
        )
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.TRIGGERS "
            "WHERE TRIGGER_SCHEMA = %s AND TRIGGER_NAME = %s",
            (db, TRIGGER),
        )
        row = cur.fetchone()
        if not row or not row[0]:
            cur.execute(trigger_sql(db))


@dataclass(frozen=True)
class Broken:
    tenant: str
    seq: int | None
    row_id: int | None
    reason: str


@dataclass
class VerifyReport:
    tenants: int = 0
    rows: int = 0
    broken: Broken | None = None

    @property
    def ok(self) -> bool:
        return self.broken is None


def _check_row(row: dict[str, Any], prev: str, expected_seq: int) -> str | None:
    tenant = row["tenant"]
    if row["seq"] != expected_seq:
        return f"sequence gap: expected seq {expected_seq}, found {row['seq']}"
    if row["prev_hash"] != prev:
        return "prev_hash does not match the previous row's hash"
    body = row["body"] or ""
    if content_hash(body) != row["content_hash"]:
        return "content_hash does not match the stored body"
    if link_hash(prev, expected_seq, tenant, row["content_hash"]) != row["row_hash"]:
        return "row_hash does not recompute"
    try:
        stored = json.loads(body)
    except ValueError:
        return "body is not JSON"
    for col in (*MIRRORED, "rows_scanned", "rows_returned"):
        if stored.get(col) != row[col]:
            return f"column {col!r} differs from the hashed body"
    if bool(stored.get("killed")) != bool(row["killed"]):
        return "column 'killed' differs from the hashed body"
    return _check_typed_columns(row, stored)


def _check_typed_columns(row: dict[str, Any], stored: dict[str, Any]) -> str | None:
    """The columns stored in another type than in the body: time, numbers, JSON."""
    for col in ("sql_hash", "trace", "duration_ms"):
        if col in row and stored.get(col) != row[col]:
            return f"column {col!r} differs from the hashed body"
    at = row.get("at")
    if isinstance(at, dt.datetime) and at.isoformat(timespec="microseconds") != stored.get("at"):
        return "column 'at' differs from the hashed body"
    for col in ("plan", "detail"):
        if col in row:
            try:
                value = json.loads(row[col]) if isinstance(row[col], str | bytes) else row[col]
            except ValueError:
                return f"column {col!r} is not JSON"
            if value != stored.get(col):
                return f"column {col!r} differs from the hashed body"
    return None


def verify(conn: Any, db: str, tenant: str | None = None) -> VerifyReport:
    """Walk every chained row (of one tenant, or all) and stop at the first broken link."""
    report = VerifyReport()
    cols = ", ".join(
        ["id", "seq", "prev_hash", "row_hash", "content_hash", "body", "killed",
         "rows_scanned", "rows_returned", "sql_hash", "trace", "duration_ms", "at", "plan",
         "detail", *[c for c in MIRRORED if c != "tenant"], "tenant"]
    )  # fmt: skip
    where = "seq IS NOT NULL" + (" AND tenant = %s" if tenant else "")
    args: tuple[Any, ...] = (tenant,) if tenant else ()
    with conn.cursor() as cur:
        cur.execute(f"SELECT tenant, seq, last_hash FROM {q(db)}.{q(HEAD_TABLE)}"
                    + (" WHERE tenant = %s" if tenant else ""), args)  # fmt: skip
        heads = {str(r[0]): (int(r[1]), str(r[2])) for r in cur.fetchall()}
        cur.execute(
            f"SELECT {cols} FROM {q(db)}.{q(AUDIT_TABLE)} WHERE {where} ORDER BY tenant, seq",
            args,
        )
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        # Every row the auditor stores gets a seq from the trigger; one without was
        # written around it (or its seq was blanked), so it is outside the chain.
        cur.execute(
            f"SELECT id, tenant FROM {q(db)}.{q(AUDIT_TABLE)} WHERE seq IS NULL"
            + (" AND tenant = %s" if tenant else "") + " ORDER BY id LIMIT 1",
            args,
        )  # fmt: skip
        unchained = cur.fetchone()
    if unchained is not None:
        report.broken = Broken(str(unchained[1]), None, int(unchained[0]),
                               "row outside the hash chain (no seq)")  # fmt: skip
        return report
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_tenant.setdefault(row["tenant"], []).append(row)
    for t in sorted(set(by_tenant) | set(heads)):
        report.tenants += 1
        prev, seq = GENESIS, 0
        for row in by_tenant.get(t, []):
            seq += 1
            reason = _check_row(row, prev, seq)
            if reason:
                report.broken = Broken(t, row["seq"], row["id"], reason)
                return report
            prev = row["row_hash"]
            report.rows += 1
        head = heads.get(t)
        if head is not None and head != (seq, prev):
            report.broken = Broken(
                t, seq, None, f"head says seq {head[0]} but the last stored row is seq {seq}"
                if head[0] != seq else "head hash differs from the last row's hash",
            )  # fmt: skip
            return report
    return report


def query(
    conn: Any, db: str, *, tenant: str, since: dt.datetime, kind: str | None, limit: int
) -> list[dict[str, Any]]:
    sql = (
        "SELECT id, seq, at, kind, event, actor, verdict, rule, request_id, question, "
        "sql_text, rows_scanned, rows_returned, duration_ms, killed, event_id, detail "
        f"FROM {q(db)}.{q(AUDIT_TABLE)} WHERE tenant = %s AND at >= %s"
    )
    args: list[Any] = [tenant, since.replace(tzinfo=None)]
    if kind:
        sql += " AND kind = %s"
        args.append(kind)
    sql += " ORDER BY at, id LIMIT %s"
    args.append(limit)
    with conn.cursor() as cur:
        cur.execute(sql, args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
