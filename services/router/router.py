"""The router: admits requests from `REQ` by tokens, queues them fairly, and dispatches
each to its partition on `WORK` only while that partition's worker has free credit.

A `REQ` message stays unacked while its request waits here (kept alive with
`in_progress()`); it is acked only after the `WORK` publish is acknowledged, so
a router crash loses nothing, and the `WORK` publish carries the request id as
`Nats-Msg-Id`, so a redelivered request is not dispatched twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg

from services.router import metrics
from services.router.fleet import Fleet
from services.router.settings import RouterSettings
from switchyard import subjects
from switchyard.answers import answer, result_for
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import dead_letter, fetch_ready
from switchyard.bus.publish import publish
from switchyard.bus.topology import ROUTER_DURABLE
from switchyard.codec import decode
from switchyard.errors import DecodeError
from switchyard.logging import bind_request, get_logger
from switchyard.messages.inference import GenerateRequest, GenerateResult
from switchyard.partition import partition
from switchyard.requestpolicy import Refusal, Tombstones, verdict
from switchyard.scheduling.admission import Admission
from switchyard.scheduling.fair import FairQueue, Item
from switchyard.scheduling.placement import Placement
from switchyard.scheduling.policy import Policies

log = get_logger(__name__)

LOAD_HALF_LIFE = 30.0  # seconds: how fast a partition's measured load forgets


@dataclass
class Queued:
    req: GenerateRequest
    msg: Msg
    received: float


@dataclass
class Outstanding:
    pool: str
    partition: int
    tenant: str
    max_tokens: int
    at: float


class Router:
    def __init__(self, bus: Bus, settings: RouterSettings, policies: Policies) -> None:
        self.bus = bus
        self.s = settings
        self.admission = Admission(policies, time.time)

        def weight(tenant: str) -> float:
            policy = self.admission.policy(tenant)
            return policy.weight if policy else 1.0

        self.queue: FairQueue[Queued] = FairQueue(
            clock=time.time, weight=weight, w_in=settings.w_in, w_out=settings.w_out,
            aging=settings.aging, locality_bound=settings.locality_bound,
        )  # fmt: skip
        self.placements = {
            pool: Placement(
                settings.partitions,
                settings.epsilon,
                settings.spill_cooldown,
                spill_epsilon=settings.spill_epsilon,
            )
            for pool in settings.pools
        }
        self.fleet = Fleet(bus.js, settings.dead_after)
        self.outstanding: dict[str, Outstanding] = {}
        self.load: dict[tuple[str, int], tuple[float, float]] = {}  # EWMA tokens/s, updated at
        self.warm: dict[str, float] = {}  # session -> last dispatch
        self.cancelled = Tombstones()  # cancels of requests not (yet) queued here
        self.labels = metrics.tenant_labels(settings.top_tenants)
        self.queue_gauges = metrics.QueueGauges(self.labels)
        self.wake = asyncio.Event()

    # -- life cycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.fleet.open()
        for pool, placement in self.placements.items():
            await self.fleet.load_assignment(pool, placement)
        subs = [
            await self.bus.nc.subscribe(subjects.RES_ALL, cb=self._on_result),
            await self.bus.nc.subscribe(subjects.CANCEL_ALL, cb=self._on_cancel),
        ]
        tasks = [
            asyncio.create_task(self._intake(stop)),
            asyncio.create_task(self._dispatch_loop(stop)),
            asyncio.create_task(self._placement_loop(stop)),
            asyncio.create_task(self._keepalive_loop(stop)),
        ]
        try:
            await stop.wait()
        finally:
            self.wake.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            # Queued requests stay unacked in REQ: another router (or this one after a
            # restart) gets them when their ack wait runs out.
            log.info("router.stopped", queued=len(self.queue))

    # -- intake: REQ -> admission -> fair queue -------------------------------------------

    async def _intake(self, stop: asyncio.Event) -> None:
        sub = await self.bus.js.pull_subscribe_bind(ROUTER_DURABLE, stream="REQ")
        while not stop.is_set():
            try:
                async for msgs in fetch_ready(sub, lambda: self.s.fetch_batch, 0.5):
                    await self._admit_all(msgs)
            except (TimeoutError, nats.errors.TimeoutError):
                continue

    async def _admit_all(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            try:
                await self._admit(msg)
            except Exception:
                log.exception("router.intake_failed")  # left unacked: redelivered later

    async def _admit(self, msg: Msg) -> None:
        try:
            req = decode(msg.data, GenerateRequest, max_bytes=self.s.max_message_bytes)
        except DecodeError as exc:
            await dead_letter(
                self.bus.js, msg, code=exc.code, reason=exc.reason, consumer=ROUTER_DURABLE
            )
            return
        with bind_request(req.id, req.tenant, req.trace):
            queued = self.queue.get(req.id)
            if queued is not None:  # redelivered while we still hold it: keep the newer handle
                queued.payload.msg = msg
                return
            if req.id in self.outstanding:
                await msg.ack()  # already dispatched; WORK dedupe covers a re-publish anyway
                return
            if req.pool not in self.placements:
                unknown = Refusal("rejected", "invalid_request", f"unknown pool {req.pool!r}")
                await self._refuse(req, msg, unknown)
                return
            if req.id in self.cancelled:
                before = Refusal("cancelled", "cancelled", "cancelled before admission")
                await self._refuse(req, msg, before)
                return
            admitted = self.admission.admit(
                req.tenant, req.id, req.prompt_tokens, req.sampling.max_tokens, req.priority
            )
            label = self.labels(req.tenant)
            if admitted.code is not None:
                metrics.REJECTED_TOKENS.labels(label, admitted.code).inc(
                    req.prompt_tokens + req.sampling.max_tokens
                )
                refused = Refusal("rejected", admitted.code, admitted.reason, admitted.retry_after)
                await self._refuse(req, msg, refused)
                return
            metrics.ADMITTED_TOKENS.labels(label, "input").inc(req.prompt_tokens)
            metrics.ADMITTED_TOKENS.labels(label, "output").inc(req.sampling.max_tokens)
            now = time.time()
            stamped = req.model_copy(
                update={"admitted_at": req.admitted_at or now, "priority": admitted.priority}
            )
            key = req.session or req.tenant
            self.queue.push(
                Item(
                    request_id=req.id, tenant=req.tenant, priority=admitted.priority,
                    prompt_tokens=req.prompt_tokens, max_tokens=req.sampling.max_tokens,
                    partition=partition(key, self.s.partitions), enqueued_at=now,
                    payload=Queued(stamped, msg, now),
                )
            )  # fmt: skip
            self.wake.set()

    async def _refuse(self, req: GenerateRequest, msg: Msg, refusal: Refusal) -> None:
        result = result_for(req, refusal.status, refusal.error)
        await answer(self.bus.nc, self.bus.js, result, req.reply)
        await msg.ack()
        metrics.ANSWERED.labels(refusal.status).inc()
        log.info("router.answered", status=refusal.status, code=refusal.code, reason=refusal.reason)

    # -- dispatch: fair queue -> WORK, within credit -------------------------------------

    def _free_credit(self, pool: str) -> dict[str, int]:
        placement = self.placements[pool]
        free: dict[str, int] = {}
        for hb in self.fleet.live(pool):
            if hb.draining:
                continue
            mine = sum(
                1 for o in self.outstanding.values()
                if o.pool == pool and placement.owner(o.partition) == hb.worker
            )  # fmt: skip
            free[hb.worker] = hb.slots * self.s.credit_per_slot - max(mine, hb.queued)
        return free

    async def _dispatch_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.25)
            self.wake.clear()
            await self._sweep()
            await self._dispatch_round()

    async def _dispatch_round(self) -> None:
        """Dispatch, in fair order, everything that has credit now."""
        credit = {pool: self._free_credit(pool) for pool in self.placements}
        owners: dict[str, str] = {}  # request id -> the worker `can_run` found with credit
        now = time.time()

        def can_run(item: Item[Queued]) -> bool:
            pool = item.payload.req.pool
            owner = self.placements[pool].owner(item.partition)
            if owner is None or credit[pool].get(owner, 0) <= 0:
                return False
            owners[item.request_id] = owner
            return True

        def warm(item: Item[Queued]) -> bool:
            session = item.payload.req.session
            return session is not None and now - self.warm.get(session, 0) < self.s.warm_seconds

        while (item := self.queue.pick(can_run, warm)) is not None:
            owner = owners[item.request_id]  # `pick` only returns an item `can_run` accepted
            credit[item.payload.req.pool][owner] -= 1
            if not await self._dispatch(item, owner):
                return

    async def _dispatch(self, item: Item[Queued], worker: str) -> bool:
        req, msg = item.payload.req, item.payload.msg
        now = time.time()
        label = self.labels.peek(req.tenant)  # its traffic was counted at admission
        with bind_request(req.id, req.tenant, req.trace):
            refusal = verdict(req, now, where="at dispatch")
            if refusal is not None:
                self.admission.finished(req.id, None)
                await self._refuse(req, msg, refusal)
                return True
            try:
                # The worker reports admission -> dispatch as the router's queueing time.
                sent = req.model_copy(
                    update={"dispatched_at": now, "partition": item.partition, "routed_to": worker}
                )
                # Registered before the publish: a fast engine can answer, and `_on_result`
                # run, while the publish and the ack are still awaited; a result for a request
                # not yet registered was dropped and its credit and concurrency held forever.
                self.outstanding[req.id] = Outstanding(
                    req.pool, item.partition, req.tenant, req.sampling.max_tokens, now
                )
                await publish(
                    self.bus.js, subjects.work(req.pool, item.partition), sent, msg_id=req.id
                )
                await msg.ack()
            except Exception as exc:
                self.outstanding.pop(req.id, None)
                log.warning("router.dispatch_failed", error=repr(exc))
                self.queue.requeue(item)  # try again next round, at the head
                return False
            self.admission.dispatched(req.id)
            if req.session:
                self.warm[req.session] = now
            self._add_load(req.pool, item.partition, req.prompt_tokens + req.sampling.max_tokens)
            metrics.QUEUE_WAIT.labels(label).observe(now - item.enqueued_at)
            metrics.TIME_IN_ROUTER.observe(now - item.payload.received)
            metrics.PLACEMENT.labels("keep").inc()
            log.debug("router.dispatched", worker=worker, partition=item.partition)
        return True

    async def _sweep(self) -> None:
        """Answer queued requests that went stale, expired or waited too long."""
        now = time.time()
        q = self.queue
        self.queue_gauges.record(q.tenants(), q.depth, lambda t: q.counters.get(t, 0.0))
        for item in self.queue.items():
            req, msg = item.payload.req, item.payload.msg
            refusal = verdict(req, now, where="while queued")
            if refusal is None and now - item.enqueued_at > self.s.max_queue_seconds:
                waited = f"queued over {self.s.max_queue_seconds:.0f}s"
                refusal = Refusal("rejected", "timeout", waited)
            if refusal is None:
                continue
            self.queue.remove(req.id)
            self.admission.finished(req.id, None)
            with bind_request(req.id, req.tenant, req.trace):
                await self._refuse(req, msg, refusal)

    # -- results, cancels, keepalive ----------------------------------------------------

    async def _on_result(self, msg: Msg) -> None:
        try:
            result = decode(msg.data, GenerateResult, max_bytes=self.s.max_message_bytes)
        except DecodeError:
            return
        out = self.outstanding.pop(result.request_id, None)
        if out is None:
            return
        self.admission.finished(result.request_id, result.usage.completion_tokens)
        self.queue.settle(out.tenant, out.max_tokens, result.usage.completion_tokens)
        self.wake.set()

    async def _on_cancel(self, msg: Msg) -> None:
        request_id = msg.subject.split(".", 1)[1]
        item = self.queue.remove(request_id)
        if item is None:
            self.cancelled.add(request_id)  # may still be on its way to us
            return  # running requests: the owning worker hears the same cancel
        req = item.payload.req
        self.admission.finished(req.id, None)
        with bind_request(req.id, req.tenant, req.trace):
            while_queued = Refusal("cancelled", "cancelled", "cancelled while queued")
            await self._refuse(req, item.payload.msg, while_queued)

    async def _keepalive_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.s.req_ack_wait / 3)
            for item in self.queue.items():
                with contextlib.suppress(Exception):
                    await item.payload.msg.in_progress()
            # Outstanding entries whose result we never saw (e.g. answered before a restart)
            # must not hold credit forever.
            cutoff = time.time() - max(600.0, 10 * self.s.max_queue_seconds)
            for rid in [r for r, o in self.outstanding.items() if o.at < cutoff]:
                del self.outstanding[rid]

    # -- placement -----------------------------------------------------------------------

    def _add_load(self, pool: str, p: int, tokens: int) -> None:
        now = time.time()
        rate, at = self.load.get((pool, p), (0.0, now))
        decay = 0.5 ** ((now - at) / LOAD_HALF_LIFE)
        self.load[(pool, p)] = (rate * decay + tokens / LOAD_HALF_LIFE, now)

    def _loads(self, pool: str) -> dict[int, float]:
        now = time.time()
        return {
            p: rate * 0.5 ** ((now - at) / LOAD_HALF_LIFE)
            for (pl, p), (rate, at) in self.load.items()
            if pl == pool
        }

    async def _placement_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._rebalance()
            except Exception:
                log.exception("router.rebalance_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.s.rebalance_interval)

    async def _rebalance(self) -> None:
        await self.fleet.refresh_workers()
        now = time.time()
        for pool, placement in self.placements.items():
            views = self.fleet.views(pool)
            moves = placement.reconcile(views, None, now)
            if not moves and views:
                # Only a fleet that needs no other move spills by load (with its own,
                # larger bound: moving a partition costs its sessions their warm cache).
                moves = placement.reconcile(views, self._loads(pool), now)
            for move in moves:
                if not await self.fleet.write(pool, move):
                    await self.fleet.load_assignment(pool, placement)
                    break
                metrics.PLACEMENT.labels(move.reason).inc()
                log.info("router.move", pool=pool, partition=move.partition, src=move.src,
                         dst=move.dst, reason=move.reason)  # fmt: skip
            for hb in self.fleet.live(pool):
                metrics.PARTITIONS.labels(pool, hb.worker).set(
                    len(placement.partitions_of(hb.worker))
                )
        if any(self.placements[p].assignment for p in self.placements):
            self.wake.set()
