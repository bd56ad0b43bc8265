"""When a fleet is ready: what its services say, never how long they have been running.

A sleep "long enough" for a fleet to settle either wastes seconds or, on a loaded
machine, is not long enough; so each wait here polls a fact the services publish:

- a pool is ready when every worker it expects heartbeats (KV `fleet_workers`) with a
  beat written since the launch began (a dead worker's entry lingers until its TTL, and
  must not count) and binds at least one partition, and when every partition of the
  pool is served: in a routed pool the router's assignment (KV `fleet_assignments`)
  names a worker whose heartbeat lists the partition as bound, in a static pool some
  worker lists it. A request sent then is pulled at once, whatever its partition;
- an HTTP service (the edge's `/readyz`) is ready when it answers 200;
- a JetStream consumer service is pulling when its durable has a pull waiting;
- a request/reply service answers when an empty request gets its `malformed` error back
  (`switchyard.bus.rpc.serve` answers what does not decode; it never reaches a handler).

Every wait calls `check` on each poll: a launcher passes one that raises when one of its
services died, so a crash fails the wait at once, with that service's log, instead of
after the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import nats.errors
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.topology import ASSIGNMENTS_BUCKET, WORKERS_BUCKET
from switchyard.codec import decode
from switchyard.errors import DecodeError
from switchyard.fleet.errors import NotReady
from switchyard.messages.fleet import Assignment, WorkerHeartbeat, assignment_key

POLL = 0.1  # s between two looks: cheap reads of a few KV keys on a local server

Check = Callable[[], None]


def _nothing() -> None:
    """The default `check`: nothing of ours to watch."""


@dataclass(frozen=True)
class PoolReady:
    """What "ready" means for one pool of workers."""

    pool: str
    workers: int  # heartbeating workers expected (all of `worker_ids` when those are known)
    partitions: int
    routed: bool = True  # a router assigns the partitions; False: the workers own them (static)
    worker_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolState:
    """A pool as it stood when it was found ready: partitions served per worker."""

    pool: str
    partitions: int
    owners: dict[str, int]

    def describe(self) -> str:
        """`llm: 64 partitions on 2 workers (32+32)`."""
        n = len(self.owners)
        text = f"{self.pool}: {self.partitions} partitions on {n} worker{'s' if n != 1 else ''}"
        shares = "+".join(str(k) for _, k in sorted(self.owners.items()))
        return text + (f" ({shares})" if n > 1 else "")


async def wait_for_pools(
    js: JetStreamContext, pools: Sequence[PoolReady], *, timeout: float, since: float = 0.0,
    check: Check = _nothing,
) -> list[PoolState]:  # fmt: skip
    """Until every pool in `pools` is ready (see the module docstring); its state then.

    `since`: only heartbeats written at or after this wall-clock time count. A launcher
    passes the time it began, so a dead worker's entry, until its TTL expires, is not
    taken for a live one; 0 (any beat) suits a pool private to one test.
    """
    workers = await js.key_value(WORKERS_BUCKET)
    assignments = await js.key_value(ASSIGNMENTS_BUCKET)
    known = {w for pool in pools for w in pool.worker_ids}
    # Every worker known by name: ask for each, list nothing.
    only_known = all(len(pool.worker_ids) >= pool.workers for pool in pools)
    deadline = time.monotonic() + timeout
    while True:
        check()
        beats = await fresh_heartbeats(js, workers, since, known, only_known=only_known)
        states, missing = [], []
        for pool in pools:
            state, why = await _pool_state(pool, beats, assignments)
            if state is None:
                missing.append(why)
            else:
                states.append(state)
        if not missing:
            return states
        if time.monotonic() > deadline:
            raise NotReady(f"not ready within {timeout:.0f} s: {'; '.join(missing)}")
        await asyncio.sleep(POLL)


async def fresh_heartbeats(
    js: JetStreamContext, kv: KeyValue, since: float, known: Iterable[str] = (), *,
    only_known: bool = False,
) -> dict[str, WorkerHeartbeat]:  # fmt: skip
    """Workers whose latest beat in `kv` (the opened WORKERS_BUCKET) was written at or
    after `since` and that are not draining.

    The workers we expect by name are asked for directly; the others are listed from the
    bucket's stream (`kv_keys`), unless `only_known`.
    """
    keys: set[str] = set()
    if not only_known:
        keys = set(await kv_keys(js, WORKERS_BUCKET))
    beats: dict[str, WorkerHeartbeat] = {}
    for key in keys | set(known):
        with contextlib.suppress(KeyNotFoundError, DecodeError):
            entry = await kv.get(key)
            if entry.value:
                beat = decode(entry.value, WorkerHeartbeat)
                if beat.at >= since and not beat.draining:
                    beats[key] = beat
    return beats


async def _pool_state(
    pool: PoolReady, beats: dict[str, WorkerHeartbeat], assignments: KeyValue
) -> tuple[PoolState | None, str]:
    """The pool's state if it is ready, else None and what it still lacks."""
    live = {w: set(b.partitions) for w, b in beats.items() if b.pool == pool.pool}
    absent = sorted(set(pool.worker_ids) - live.keys())
    if absent:
        return None, f"pool {pool.pool}: no heartbeat yet from {', '.join(absent)}"
    if len(live) < pool.workers:
        return None, f"pool {pool.pool}: {len(live)} of {pool.workers} workers heartbeating"
    idle = sorted(w for w, bound in live.items() if not bound)
    if idle and len(live) <= pool.partitions:
        return None, f"pool {pool.pool}: {', '.join(idle)} bound no partition yet"
    owners: dict[str, int] = {}
    unserved = []
    for p in range(pool.partitions):
        owner = await _owner(assignments, pool.pool, p) if pool.routed else None
        if pool.routed:
            serving = owner if owner is not None and p in live.get(owner, set()) else None
        else:
            serving = next((w for w, bound in sorted(live.items()) if p in bound), None)
        if serving is None:
            unserved.append(p)
        else:
            owners[serving] = owners.get(serving, 0) + 1
    if unserved:
        what = "assigned to a live worker and bound" if pool.routed else "bound by a worker"
        return None, f"pool {pool.pool}: {len(unserved)} of {pool.partitions} partitions not {what}"
    return PoolState(pool.pool, pool.partitions, owners), ""


async def _owner(kv: KeyValue, pool: str, partition: int) -> str | None:
    with contextlib.suppress(KeyNotFoundError, DecodeError):
        entry = await kv.get(assignment_key(pool, partition))
        if entry.value:
            return decode(entry.value, Assignment).worker
    return None


async def wait_for_responder(
    nc: Client, subject: str, *, timeout: float, check: Check = _nothing
) -> None:
    """Until a request/reply service subscribes to `subject` and answers."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        with contextlib.suppress(NoRespondersError, nats.errors.TimeoutError):
            await nc.request(subject, b"", timeout=1.0)
            return
        if time.monotonic() > deadline:
            raise NotReady(f"nothing answered on {subject} within {timeout:.0f} s")
        await asyncio.sleep(POLL)


def wait_http(
    url: str, *, timeout: float, check: Check = _nothing, cafile: Path | None = None
) -> None:
    """Until `url` answers 200 (over HTTPS trusting `cafile`, if given). Blocking: from a
    loop, run it with `asyncio.to_thread`."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    tls = ssl.create_default_context(cafile=str(cafile)) if cafile is not None else None
    while True:
        check()
        try:
            # A local URL of ours (S310: urlopen would also take file: URLs).
            with urllib.request.urlopen(url, timeout=2, context=tls) as resp:  # noqa: S310
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:  # /readyz answers 503 until it is ready
            last = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise NotReady(f"{url} did not answer 200 within {timeout:.0f} s ({last})")
        time.sleep(POLL * 2)
