"""Session routes in KV `fleet_sessions`, mirrored into each pool's `Affinity`.

Every router watches the whole bucket (one ordered consumer, no per-request reads), so a
session another router placed, or that this router placed before a restart, goes to the
same worker. A new route is written with `create`, a changed or refreshed one with
`update` on the revision last seen: when two routers place one new session at the same
moment, the second `create` fails, the winner's route arrives through the watch and every
later request follows it (the one request the loser already dispatched ran elsewhere, a
cache miss, never a lost or doubled request). Entries expire with the bucket's TTL; each
router drops its mirror's entries by the same clock (`Affinity.expire`), because an
expiry leaves no marker in the stream on NATS before 2.11.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Literal

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from switchyard.bus.topology import SESSIONS_BUCKET
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import SessionRoute, session_key
from switchyard.scheduling.affinity import Affinity, Decision

log = get_logger(__name__)

# The reasons a route records; the rest of `Decision.reason` is a first placement.
MOVE_REASONS: dict[str, Literal["dead", "drain", "load"]] = {
    "dead": "dead", "drain": "drain", "load": "load",
}  # fmt: skip
DRAIN_TIMEOUT = 5.0  # s: queued route writes get this long at shutdown
WATCH_POLL = 1.0  # s: how often the watch loop looks at `stop` while nothing changes


def route_id(tenant: str, session: str) -> str:
    """How `Affinity` names a session: per tenant, as the KV key does (after the pool)."""
    return f"{tenant}.{session}"


class SessionsNotOpen(RuntimeError):
    """A read or write before `SessionTable.open()`: the router's wiring is wrong."""


@dataclass(frozen=True)
class _Write:
    pool: str
    tenant: str
    session: str
    decision: Decision
    at: float


class SessionTable:
    def __init__(self, js: JetStreamContext, affinity: dict[str, Affinity]) -> None:
        self.js = js
        self.affinity = affinity
        self._kv: KeyValue | None = None
        self._watcher: KeyValue.KeyWatcher | None = None
        self._revisions: dict[str, int] = {}
        # Writes wait here, off the dispatch path: this router's own mirror already has
        # the route (`Affinity.commit`), so only other routers wait for it, by a few ms.
        self._writes: asyncio.Queue[_Write] = asyncio.Queue()

    async def open(self) -> None:
        """Start the watch and read every live route before returning."""
        self._kv = await self.js.key_value(SESSIONS_BUCKET)
        self._watcher = await self._kv.watchall()
        while (entry := await self._watcher.updates(30.0)) is not None:  # type: ignore[no-untyped-call]
            self._apply(entry)

    async def follow(self, stop: asyncio.Event) -> None:
        """Apply other routers' writes (and our own, echoed), and write ours, until `stop`;
        then write what is still queued (routes are soft state: a write lost to a crash
        costs the session's next request a fresh placement here, nothing more)."""
        watcher = self._opened_watcher()
        writer = asyncio.create_task(self._write_loop())
        try:
            while not stop.is_set():
                try:
                    entry = await watcher.updates(WATCH_POLL)  # type: ignore[no-untyped-call]
                except nats.errors.TimeoutError:
                    continue
                if entry is not None:
                    self._apply(entry)
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._writes.join(), DRAIN_TIMEOUT)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def lookup(self, pool: str, tenant: str, session: str) -> None:
        """Read a session's route this router does not know yet: another router may have
        placed it a moment ago, before its write reached this router's watch."""
        affinity = self.affinity.get(pool)
        if affinity is None or route_id(tenant, session) in affinity.routes:
            return
        with contextlib.suppress(KeyNotFoundError, nats.errors.Error):
            self._apply(await self._opened_kv().get(session_key(pool, tenant, session)))

    def record(self, pool: str, tenant: str, session: str, decision: Decision, now: float) -> None:
        """Queue the write of the route `decision` made (or refreshed) for `session`."""
        self._writes.put_nowait(_Write(pool, tenant, session, decision, now))

    async def _write_loop(self) -> None:
        while True:
            write = await self._writes.get()
            try:
                await self._write(write)
            finally:
                self._writes.task_done()

    def _apply(self, entry: KeyValue.Entry, *, adopt: bool = False) -> None:
        pool = entry.key.split(".", 1)[0]
        affinity = self.affinity.get(pool)
        if affinity is None:
            return  # a pool this router does not serve
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self._revisions.pop(entry.key, None)
            affinity.forget(entry.key.split(".", 1)[1] if "." in entry.key else "")
            return
        try:
            route = decode(entry.value, SessionRoute)
        except DecodeError as exc:
            log.warning("router.bad_session_route", key=entry.key, reason=exc.reason)
            return
        if entry.revision is not None:
            self._revisions[entry.key] = entry.revision
        affinity.learn(route_id(route.tenant, route.session), route.worker, route.at, adopt=adopt)

    async def _write(self, w: _Write) -> None:
        """Write one route. Never raises: the request is already dispatched, and a route
        that could not be written is still in this router's mirror."""
        pool, tenant, session, decision, now = w.pool, w.tenant, w.session, w.decision, w.at
        kv = self._opened_kv()
        key = session_key(pool, tenant, session)
        value = encode(
            SessionRoute(pool=pool, tenant=tenant, session=session, worker=decision.worker, at=now,
                         reason=MOVE_REASONS.get(decision.reason, "new"))
        )  # fmt: skip
        try:
            last = self._revisions.get(key)
            if last is None:
                self._revisions[key] = await kv.create(key, value)
            else:
                self._revisions[key] = await kv.update(key, value, last=last)
        except (KeyWrongLastSequenceError, nats.js.errors.BadRequestError) as exc:
            # Another router wrote the key first (`create` on an existing key is a bad
            # request; `update` on a stale revision a wrong last sequence): adopt its route.
            log.info("router.session_conflict", key=key, error=str(exc))
            with contextlib.suppress(KeyNotFoundError, nats.errors.Error):
                self._apply(await kv.get(key), adopt=True)
        except Exception as exc:  # the writer must outlive any one write
            log.warning("router.session_write_failed", key=key, error=repr(exc))

    def _opened_kv(self) -> KeyValue:
        if self._kv is None:
            raise SessionsNotOpen("SessionTable.open() must be awaited first")
        return self._kv

    def _opened_watcher(self) -> KeyValue.KeyWatcher:
        if self._watcher is None:
            raise SessionsNotOpen("SessionTable.open() must be awaited first")
        return self._watcher
