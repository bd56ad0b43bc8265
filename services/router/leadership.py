"""Exactly one router admits and dispatches at a time: a lease in KV `fleet_router`.

Why one: a router keeps every tenant's token buckets and fair-queue counters in its own
memory (`scheduling.admission`, `scheduling.fair`). Two routers admitting at once would
give each tenant twice its limits and split its fairness between two queues. Sharing them
instead (a KV compare-and-set per admission) would put a round trip to the meta leader of
a replicated bucket on every request, and sharding tenants over routers would still split
fairness between the shards. One active router keeps a single truth for limits, fairness
and the console's tenant view, and its CPU (~0.5 ms a request, `sy bench peers
overhead`) carries ~2,000 requests/s, far more than a GPU fleet of this size sends. The
other routers stand by, and the first to find the lease gone takes over.

The lease is one key (`router_lease_key(pools)`) in a bucket whose TTL is the lease's
length. The holder rewrites it, compare-and-set on its last revision, every quarter of
that.
It holds the lease only until one TTL after it *sent* its last successful renewal: the
server cannot expire the key before then (it counts from when it stored the write), so a
holder that cannot renew (partitioned, paused) stops admitting before a standby can
`create` the key: two routers never admit at once. A router that stops releases the key
so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from switchyard.backoff import Backoff
from switchyard.bus.publish import UNAVAILABLE
from switchyard.bus.topology import ROUTER_BUCKET
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import RouterLease, router_lease_key

log = get_logger(__name__)

# Slack kept between the holder's own deadline and the server's expiry of the key.
MARGIN = 0.5
# Each renewal's wait for the server (a renewal that cannot land within the lease is moot).
RENEW_TIMEOUT = 1.0
# How often a standby tries to take the lease: a released lease is taken within 0.5 s.
# Jittered (0.25-0.5 s), so two standbys do not ask in lockstep.
STANDBY_POLL = Backoff(first=0.5, cap=0.5)
RENEWAL_FAILED: tuple[type[Exception], ...] = (*UNAVAILABLE, TimeoutError)


class Lease:
    """The router lease for `pools`, acquired and held by `router`."""

    def __init__(self, js: JetStreamContext, router: str, pools: list[str]) -> None:
        self.js = js
        self.router = router
        self.key = router_lease_key(pools)
        self.ttl = 0.0  # the bucket's TTL, read when the lease is first sought
        self.since = 0.0
        self._revision = 0
        self._deadline = 0.0  # monotonic: until when this router may act as the holder
        self._kv: KeyValue | None = None

    @property
    def held(self) -> bool:
        return self._revision != 0 and time.monotonic() < self._deadline

    async def _bucket(self) -> KeyValue:
        """The bucket, looked up (and its TTL read) once: every acquire attempt and renewal
        then goes to the stream's own subjects, not to the JetStream API again."""
        if self._kv is None:
            kv = await self.js.key_value(ROUTER_BUCKET)
            ttl = float((await kv.status()).ttl or 0.0)
            if ttl <= 2 * MARGIN:
                raise ValueError(
                    f"KV {ROUTER_BUCKET} needs a TTL above {2 * MARGIN}s: provision it"
                )
            self._kv, self.ttl = kv, ttl
        return self._kv

    def _value(self) -> bytes:
        return encode(RouterLease(router=self.router, since=self.since, at=time.time()))

    async def holder(self) -> RouterLease | None:
        """Who holds the lease now, as the bucket says."""
        kv = await self._bucket()
        with contextlib.suppress(KeyNotFoundError, DecodeError):
            entry = await kv.get(self.key)
            if entry.value:
                return decode(entry.value, RouterLease)
        return None

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this router holds the lease (True), or `stop` (False)."""
        announced = False
        while not stop.is_set():
            try:
                kv = await self._bucket()
                sent = time.monotonic()
                self.since = time.time()
                self._revision = await kv.create(self.key, self._value())
                self._deadline = sent + self.ttl - MARGIN
                log.info("router.lease_acquired", key=self.key, ttl=self.ttl)
                return True
            except KeyWrongLastSequenceError:
                if not announced:
                    current = None
                    with contextlib.suppress(*UNAVAILABLE):  # only for the log line
                        current = await self.holder()
                    log.info("router.standing_by", key=self.key,
                             holder=current.router if current else None)  # fmt: skip
                    announced = True
            except KeyNotFoundError:
                # The holder's key expired between our create and the check nats-py makes
                # after it (whether the key was deleted): the lease is free, ask again now.
                continue
            except UNAVAILABLE as exc:
                log.warning("router.lease_unavailable", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STANDBY_POLL.delay(0))
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew the lease until `stop`; returns early, having stepped down, once it is
        lost (another router holds it, or it could not be renewed in time)."""
        try:
            kv = await self._bucket()
        except RENEWAL_FAILED as exc:  # looked up moments ago by `acquire`: rare
            log.warning("router.lease_renewal_failed", error=repr(exc))
            self._revision = 0
            kv = None
        while kv is not None and not stop.is_set() and self.held:
            wait = min(self.ttl / 4, max(0.0, self._deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            if stop.is_set() or not self.held:
                break
            sent = time.monotonic()
            try:
                update = kv.update(self.key, self._value(), last=self._revision)
                self._revision = await asyncio.wait_for(update, RENEW_TIMEOUT)
                self._deadline = sent + self.ttl - MARGIN
            except KeyWrongLastSequenceError:
                log.warning("router.lease_taken", key=self.key)
                self._revision = 0
            except RENEWAL_FAILED as exc:
                log.warning("router.lease_renewal_failed", error=repr(exc))
        if not stop.is_set():
            log.warning("router.lease_lost", key=self.key)

    async def release(self) -> None:
        """Give the lease up (if still ours) so a standby need not wait for its expiry."""
        if not self._revision:
            return
        revision, self._revision = self._revision, 0
        with contextlib.suppress(Exception):
            kv = await self._bucket()
            await asyncio.wait_for(kv.delete(self.key, last=revision), RENEW_TIMEOUT)
            log.info("router.lease_released", key=self.key)
