"""The router: admits requests from `REQ` by tokens, queues them fairly, picks each one's
worker (`scheduling.affinity`: sticky per session, prefix-aware without one, bounded by
load in tokens) and dispatches it on `WORK` on a partition that worker owns, only while
the worker has free credit (`scheduling.credit`).

A `REQ` message stays unacked while its request waits here (kept alive with
`in_progress()`); it is acked only after the `WORK` publish is acknowledged, so
a router crash loses nothing, and the `WORK` publish carries the request id as
`Nats-Msg-Id`, so a redelivered request is not dispatched twice.

Superseding (agent steps): the router that admits step n of a session publishes
`NewestStep` on `supersede.<tenant>`; every router (this one too) keeps the newest step per
session (`requestpolicy.NewestSteps`), so an older step still in any router's queue is
answered `superseded` at the next sweep, one that arrives after a newer one at admission,
and workers refuse one dispatched but not yet started the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js.api import PubAck

from services.router import metrics
from services.router.fleet import Fleet
from services.router.sessions import SessionTable, route_id
from services.router.settings import RouterSettings
from switchyard import otel, subjects
from switchyard.answers import answer, result_for
from switchyard.bus import streamread
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import Puller, dead_letter
from switchyard.bus.publish import UNAVAILABLE, trace_headers
from switchyard.bus.topology import ROUTER_DURABLE
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.logging import bind_request, get_logger
from switchyard.messages.inference import GenerateRequest, KvHandoff, NewestStep
from switchyard.partition import fnv1a_32, partition
from switchyard.requestpolicy import NewestSteps, Refusal, Tombstones, verdict
from switchyard.scheduling.admission import Admission
from switchyard.scheduling.affinity import Affinity, Block, Decision, WorkerLoad, prefix_blocks
from switchyard.scheduling.credit import Ledger, Release, backstop, read_result
from switchyard.scheduling.fair import FairQueue, Item
from switchyard.scheduling.links import distance, link_class
from switchyard.scheduling.placement import Placement
from switchyard.scheduling.policy import Policies
from switchyard.vlmgeometry import DEFAULT_VLM, vlm_profile

log = get_logger(__name__)

# How long dispatch pauses after a WORK publish failed: a cluster elects a new stream
# leader in seconds; retrying every queued request at once meanwhile only spins.
DISPATCH_PAUSE = 0.5


@dataclass
class Queued:
    req: GenerateRequest
    msg: Msg
    received: float  # delivered from REQ (Unix seconds)
    blocks: list[Block]  # the prompt's prefix blocks, hashed once at admission


def delivery_partition(owned: list[int], key: str, partitions: int) -> int:
    """The partition of `owned` (the chosen worker's, non-empty) a request travels on: its
    key's own partition when the worker owns it, else one of the worker's picked by the key,
    so a session's requests keep to one partition while ownership stands still."""
    home = partition(key, partitions)
    if home in owned:
        return home
    return owned[fnv1a_32(key.encode()) % len(owned)]


def _distances_from(kv_at: str, location: Callable[[str], str]) -> Callable[[str], int]:
    """A worker's distance (scheduling/links.py) from where a decode stage's KV is."""
    return lambda worker: distance(kv_at, location(worker))


def work_msg_id(req: GenerateRequest) -> str:
    """WORK's dedupe id of a dispatch: the request's, its decode stage's apart (#39), so
    the decode stage of a request whose prefill went out on WORK is not taken for it."""
    return f"{req.id}.decode" if req.stage == "decode" else req.id


def _newest_step(req: GenerateRequest) -> NewestStep | None:
    """The notice that `req` is its session's newest step, if it is an agent step."""
    if req.session is None or req.step is None:
        return None
    return NewestStep(tenant=req.tenant, session=req.session, step=req.step, trace=req.trace)


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
            pool: Placement(settings.partitions, settings.epsilon) for pool in settings.pools
        }
        self.affinity = {
            pool: Affinity(
                settings.routing_policy, settings.load_epsilon, hold=settings.move_hold,
                cooldown=settings.move_cooldown, ttl=settings.session_ttl,
                window=settings.load_window, prefix_weight=settings.prefix_weight,
            )
            for pool in settings.pools
        }  # fmt: skip
        # A disaggregated pool's decode stages (#39) keep their sessions on a decode worker
        # too (its cache holds the session's KV, so a handoff moves only the new tokens);
        # in memory only: a lost route costs one handoff of the whole prompt, not a prefill.
        self.decode_affinity = {
            pool: Affinity(
                settings.routing_policy, settings.load_epsilon, hold=settings.move_hold,
                cooldown=settings.move_cooldown, ttl=settings.session_ttl,
                window=settings.load_window, prefix_weight=0.0,
            )
            for pool in settings.pools
        }  # fmt: skip
        # Decode stages handed back by prefill workers, in arrival order: admitted already
        # (at their prefill), they go out before anything new.
        self.decoding: dict[str, Queued] = {}
        self.prefill_workers: dict[str, set[str]] = {}  # per pool, as of the last round
        self.sessions = SessionTable(bus.js, self.affinity)
        self.policies = policies
        self.fleet = Fleet(bus.js, settings.dead_after)
        self.ledger = Ledger(
            time.time, settings.credit_per_slot, backstop(settings.max_queue_seconds)
        )
        self.warm: dict[str, float] = {}  # session -> last dispatch
        self.cancelled = Tombstones()  # cancels of requests not (yet) queued here
        self.newest = NewestSteps()  # agent sessions' newest admitted step, from every router
        self.labels = metrics.tenant_labels(settings.top_tenants)
        self.tracer = otel.tracer("router")
        self.queue_gauges = metrics.QueueGauges(self.labels)
        self.wake = asyncio.Event()
        self.settling: set[asyncio.Task[None]] = set()  # dispatches awaiting WORK's ack
        # After a WORK publish failed (the stream has no leader for a moment), dispatch
        # waits until then (monotonic) instead of sending the queue into the same wall.
        self.dispatch_paused_until = 0.0
        self.reconnects_seen = 0  # the connection's reconnects whose missed results were read

    # -- life cycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.fleet.open()
        for pool, placement in self.placements.items():
            await self.fleet.load_assignment(pool, placement)
        await self.sessions.open()  # every live session route, before the first dispatch
        subs = [
            await self.bus.nc.subscribe(subjects.RES_ALL, cb=self._on_result),
            await self.bus.nc.subscribe(subjects.CANCEL_ALL, cb=self._on_cancel),
            await self.bus.nc.subscribe(subjects.SUPERSEDE_ALL, cb=self._on_newest),
        ]
        tasks = [
            asyncio.create_task(self._intake(stop)),
            asyncio.create_task(self._dispatch_loop(stop)),
            asyncio.create_task(self._placement_loop(stop)),
            asyncio.create_task(self._keepalive_loop(stop)),
            asyncio.create_task(self.sessions.follow(stop)),
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
            if self.settling:  # dispatches whose WORK ack is on its way: ack REQ for them
                await asyncio.wait(set(self.settling), timeout=self.s.work_publish_timeout)
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            # Queued requests go back to REQ now, for the router that takes over (a
            # killed router's come back when their ack wait runs out).
            queued = [item.payload.msg for item in self.queue.items()]
            queued += [stage.msg for stage in self.decoding.values()]
            for msg in queued:
                with contextlib.suppress(Exception):
                    await msg.nak()
            log.info("router.stopped", queued=len(queued))

    # -- intake: REQ -> admission -> fair queue -------------------------------------------

    async def _intake(self, stop: asyncio.Event) -> None:
        """REQ, read continuously (`bus.consumer.Puller`) and admitted one message at a time
        in arrival order; a message left unacked (a failure, or still in `arrived` when the
        router stops) is redelivered after its ack wait."""
        arrived: asyncio.Queue[Msg] = asyncio.Queue()
        puller = Puller(self.bus.js, "REQ", ROUTER_DURABLE, arrived.put_nowait,
                        lambda: self.s.fetch_batch - arrived.qsize())  # fmt: skip
        pulling = asyncio.create_task(puller.run())
        try:
            while not stop.is_set():
                msg = await arrived.get()
                puller.wake()
                try:
                    await self._admit(msg)
                except Exception:
                    log.exception("router.intake_failed")
        finally:
            pulling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pulling

    async def _admit(self, msg: Msg) -> None:
        arrived = time.time()
        try:
            req = decode(msg.data, GenerateRequest, max_bytes=self.s.max_message_bytes)
        except DecodeError as exc:
            await dead_letter(
                self.bus.js, msg, code=exc.code, reason=exc.reason, consumer=ROUTER_DURABLE
            )
            return
        with bind_request(req.id, req.tenant, req.trace):
            if req.handoff is not None:  # a decode stage (the message's rule)
                await self._admit_decode(req, req.handoff, msg, arrived)
                return
            queued = self.queue.get(req.id)
            if queued is not None:  # redelivered while we still hold it: keep the newer handle
                queued.payload.msg = msg
                return
            if req.id in self.ledger:
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
            # An older step arriving after a newer one (preprocessors run steps in parallel),
            # or one already stale or expired, costs no admission tokens.
            late = verdict(req, time.time(), newest=self.newest.newest(req), where="at admission")
            if late is not None:
                await self._refuse(req, msg, late)
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
            # The salt is the router's to set, never the producer's: a request carrying
            # another tenant's salt could time that tenant's cached prompts.
            salt = self.policies.cache_salt(req.tenant)
            stamped = req.model_copy(
                update={"admitted_at": req.admitted_at or now, "priority": admitted.priority,
                        "cache_salt": salt}
            )  # fmt: skip
            vlm = req.frame_geometry.vlm if req.frame_geometry else DEFAULT_VLM
            blocks = prefix_blocks(
                salt, req.messages, req.prompt, req.images, vlm_profile(vlm).patch_px
            )
            if req.session:
                await self.sessions.lookup(req.pool, req.tenant, req.session)
            self.queue.push(
                Item(
                    request_id=req.id, tenant=req.tenant, priority=admitted.priority,
                    prompt_tokens=req.prompt_tokens, max_tokens=req.sampling.max_tokens,
                    partition=partition(self._key(req, blocks), self.s.partitions),
                    enqueued_at=now, payload=Queued(stamped, msg, arrived, blocks),
                )
            )  # fmt: skip
            notice = _newest_step(req)
            if notice is not None and self.newest.see(notice.tenant, notice.session, notice.step):
                await self._announce(notice)
            self.wake.set()

    async def _admit_decode(
        self, req: GenerateRequest, handoff: KvHandoff, msg: Msg, arrived: float
    ) -> None:
        """A prefill worker handed a request's decode stage back (#39): the prefill's credit
        comes back, as a result would give it, and the decode stage waits for a decode
        worker, ahead of new work. Its tenant was admitted at the prefill; what it reserved
        is released by the final result."""
        if req.pool not in self.placements:
            unknown = Refusal("rejected", "invalid_request", f"unknown pool {req.pool!r}")
            await self._refuse(req, msg, unknown)
            return
        held = self.decoding.get(req.id)
        if held is not None:  # redelivered while it waits here: keep the newer handle
            held.msg = msg
            return
        if self.ledger.decoding(req.id):
            await msg.ack()  # its decode stage went out already; WORK dedupe covers the rest
            return
        now = time.time()
        self.fleet.heard_from(handoff.worker, now)
        self.ledger.handed_off(req.id, handoff.worker, handoff.prefilled_at)
        self.wake.set()
        late = verdict(
            req, now, cancelled=req.id in self.cancelled, newest=self.newest.newest(req),
            where="between its prefill and decode",
        )  # fmt: skip
        if late is not None:
            self.admission.finished(req.id, None)
            await self._refuse(req, msg, late)
            return
        self.decoding[req.id] = Queued(req, msg, arrived, [])

    async def _announce(self, notice: NewestStep) -> None:
        """Tell every router and worker that `notice.step` is its session's newest (the
        sweep that `wake` runs answers this router's older ones)."""
        try:
            await self.bus.nc.publish(subjects.supersede(notice.tenant), encode(notice))
        except Exception as exc:  # best effort: without it an older step merely runs
            log.warning("router.announce_failed", error=repr(exc))

    async def _refuse(self, req: GenerateRequest, msg: Msg, refusal: Refusal) -> None:
        with self.tracer.hop("router", req.trace, start=req.admitted_at) as hop:
            if refusal.status in otel.FAILED:
                hop.fail(refusal.code, refusal.reason)
            result = result_for(req, refusal.status, refusal.error)
            await answer(self.bus.nc, self.bus.js, result, req.reply)
        await msg.ack()
        metrics.ANSWERED.labels(refusal.status).inc()
        log.info("router.answered", status=refusal.status, code=refusal.code, reason=refusal.reason)

    # -- dispatch: fair queue -> WORK, within credit -------------------------------------

    @staticmethod
    def _key(req: GenerateRequest, blocks: list[Block]) -> str:
        """What a request's delivery partition is derived from: its session, else its
        prompt's first block (so one prefix keeps to one partition of a worker)."""
        if req.session:
            return req.session
        return blocks[0].digest.hex() if blocks else req.id

    def _loads(self, pool: str) -> tuple[dict[str, WorkerLoad], dict[str, WorkerLoad]]:
        """Every live worker of `pool` that owns a partition (so a request can reach it),
        its load in tokens and whether it has credit for one more request: those that take
        a request first (`both`, and `prefill` while a decode worker is live to hand off
        to), and the `decode` workers (#39)."""
        placement = self.placements[pool]
        live = [hb for hb in self.fleet.live(pool) if placement.holds(hb.worker)]
        loads = self.ledger.loads(pool, live)
        decode = {hb.worker: loads[hb.worker] for hb in live if hb.role == "decode"}
        first = {
            hb.worker: loads[hb.worker] for hb in live
            if hb.role == "both" or (hb.role == "prefill" and decode)
        }  # fmt: skip
        self.prefill_workers[pool] = {hb.worker for hb in live if hb.role == "prefill"}
        return first, decode

    async def _dispatch_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.25)
            self.wake.clear()
            await self._sweep()
            if time.monotonic() >= self.dispatch_paused_until:
                await self._dispatch_round()

    async def _dispatch_round(self) -> None:
        """Dispatch, in fair order, everything that has a worker with credit now."""
        now = time.time()
        both = {pool: self._loads(pool) for pool in self.placements}
        loads = {pool: first for pool, (first, _) in both.items()}
        for pool, affinity in self.affinity.items():
            affinity.observe(list(loads[pool].values()), now)
        decoders = {pool: decode for pool, (_, decode) in both.items()}
        for pool, affinity in self.decode_affinity.items():
            affinity.observe(list(decoders[pool].values()), now)
        if not await self._dispatch_decodes(decoders, now):
            return
        decided: dict[str, Decision] = {}  # request id -> what `can_run` decided for it

        def can_run(item: Item[Queued]) -> bool:
            req = item.payload.req
            workers = loads[req.pool]
            session = route_id(req.tenant, req.session) if req.session else None
            decision = self.affinity[req.pool].choose(
                list(workers.values()),
                req.prompt_tokens,
                req.sampling.max_tokens,
                session,
                item.payload.blocks,
                now,
                req.kv_window_tokens,
            )
            if decision is None or not workers[decision.worker].has_credit:
                return False
            decided[item.request_id] = decision
            return True

        def warm(item: Item[Queued]) -> bool:
            req = item.payload.req
            if not req.session:
                return False
            return now - self.warm.get(route_id(req.tenant, req.session), 0) < self.s.warm_seconds

        while (item := self.queue.pick(can_run, warm)) is not None:
            decision = decided[item.request_id]  # `pick` only returns what `can_run` accepted
            sent = await self._dispatch(item.payload, decision, item)
            if sent is None:
                return  # the bus refused the publish: try again next round
            if not sent:
                continue  # refused at dispatch: no load taken
            req = item.payload.req
            was = loads[req.pool][decision.worker]  # this dispatch adds load and takes credit
            loads[req.pool][decision.worker] = dataclasses.replace(
                was, load=was.load + decision.work, credit=was.credit - 1
            )

    async def _dispatch_decodes(self, decoders: dict[str, dict[str, WorkerLoad]], now: float
                                ) -> bool:  # fmt: skip
        """Dispatch the decode stages waiting here, oldest first, each to a decode worker of
        its pool with credit (sticky per session). False: the bus refused a publish."""
        for queued in list(self.decoding.values()):
            req = queued.req
            workers = decoders.get(req.pool, {})
            session = route_id(req.tenant, req.session) if req.session else None
            # The KV is on the prefill worker: the nearest decode worker its load allows.
            kv_at = self.fleet.location(req.handoff.worker) if req.handoff is not None else ""
            decision = self.decode_affinity[req.pool].choose(
                list(workers.values()), 0, req.sampling.max_tokens, session, [], now,
                req.kv_window_tokens, _distances_from(kv_at, self.fleet.location),
            )  # fmt: skip
            if decision is None or not workers[decision.worker].has_credit:
                continue
            del self.decoding[req.id]
            sent = await self._dispatch(queued, decision, None)
            if sent is None:
                return False
            if sent:
                link = link_class(kv_at, self.fleet.location(decision.worker))
                metrics.DECODE_REQUESTS.labels(req.pool, link).inc()
                was = workers[decision.worker]
                workers[decision.worker] = dataclasses.replace(
                    was, load=was.load + decision.work, credit=was.credit - 1
                )
        return True

    async def _dispatch(
        self, queued: Queued, decision: Decision, item: Item[Queued] | None
    ) -> bool | None:
        """Publish a request (`item`, from the fair queue; None: a decode stage) on WORK
        without waiting for the stream's ack (`_settle` waits, in its own task, then acks
        REQ), so one round sends its requests back to back instead of one per round trip.
        False: refused here instead; None: the publish failed (it is back at the head of
        its queue)."""
        req, msg = queued.req, queued.msg
        worker = decision.worker
        owned = self.placements[req.pool].partitions_of(worker)
        part = delivery_partition(owned, self._key(req, queued.blocks), self.s.partitions)
        now = time.time()
        with bind_request(req.id, req.tenant, req.trace):
            refusal = verdict(req, now, newest=self.newest.newest(req), where="at dispatch")
            if refusal is not None:
                self.admission.finished(req.id, None)
                await self._refuse(req, msg, refusal)
                return False
            # The worker reports admission -> dispatch as the router's queueing time. A
            # request sent to a prefill worker runs its prefill stage only (#39).
            stage = req.stage
            if item is not None and worker in self.prefill_workers.get(req.pool, ()):
                stage = "prefill"
            # The router's span, from REQ's delivery to the WORK publish: admission, the
            # fair queue (a decode stage has none: it waits ahead of it), the publish.
            hop = self.tracer.begin("router", req.trace, start=queued.received,
                                    worker=worker, partition=part, stage=stage)  # fmt: skip
            enqueued = item.enqueued_at if item is not None else queued.received
            hop.child("router.admit", queued.received, enqueued)
            hop.child("router.queue", enqueued, now)
            sent = req.model_copy(
                update={"dispatched_at": now, "partition": part, "routed_to": worker,
                        "stage": stage, "trace": hop.traceparent}
            )  # fmt: skip
            self.ledger.dispatch(
                req.id,
                req.pool,
                worker,
                req.tenant,
                req.sampling.max_tokens,
                decision.work,
                decode=item is None,
            )
            # Committed now, not at the ack: the next pick of this round must see where
            # this session and prefix went.
            affinity = self.affinity if item is not None else self.decode_affinity
            affinity[req.pool].commit(decision, queued.blocks, now)
            try:
                stored = await self.bus.js.publish_async(
                    subjects.work(req.pool, part), encode(sent),
                    headers=trace_headers(sent, work_msg_id(sent)),
                )  # fmt: skip
            except Exception as exc:
                hop.fail("dispatch_failed", repr(exc))
                hop.end()
                self._undispatch(queued, item, exc)
                return None
            hop.child("router.dispatch", now, time.time())
            hop.end()
            log.debug("router.dispatched", worker=worker, partition=part, reason=decision.reason,
                      stage=stage)  # fmt: skip
        task = asyncio.create_task(self._settle(queued, item, decision, stored, now))
        self.settling.add(task)  # held until done: the loop keeps weak references
        task.add_done_callback(self.settling.discard)
        return True

    async def _settle(
        self, queued: Queued, item: Item[Queued] | None, decision: Decision,
        stored: asyncio.Future[PubAck], at: float,
    ) -> None:  # fmt: skip
        """WORK stored it: ack REQ (only now: a router crash before this loses nothing, the
        WORK dedupe by request id stops a second dispatch) and book the dispatch."""
        req, msg = queued.req, queued.msg
        label = self.labels.peek(req.tenant)  # its traffic was counted at admission
        with bind_request(req.id, req.tenant, req.trace):
            try:
                ack = await asyncio.wait_for(stored, self.s.work_publish_timeout)
                await msg.ack()
            except Exception as exc:
                self._undispatch(queued, item, exc)  # the next round after the pause resends
                return
            self.admission.dispatched(req.id)
            if ack.duplicate:
                await self._take_earlier_result(req)
            if item is None:  # a decode stage: its admission and session were its prefill's
                return
            if req.session:
                self.warm[route_id(req.tenant, req.session)] = at
                if decision.write:
                    self.sessions.record(req.pool, req.tenant, req.session, decision, at)
            metrics.QUEUE_WAIT.labels(label).observe(at - item.enqueued_at)
            metrics.TIME_IN_ROUTER.observe(at - queued.received)
            metrics.ROUTE.labels(req.pool, decision.reason).inc()
            if decision.reason in ("dead", "drain", "load"):
                log.info("router.session_moved", session=req.session, worker=decision.worker,
                         reason=decision.reason)  # fmt: skip

    def _undispatch(self, queued: Queued, item: Item[Queued] | None, exc: Exception) -> None:
        """The WORK publish failed: back to the head of its queue for a round after a pause."""
        self.ledger.undispatch(queued.req.id)
        log.warning("router.dispatch_failed", error=repr(exc))
        if item is not None:
            self.queue.requeue(item)
        else:
            self.decoding = {queued.req.id: queued, **self.decoding}
        self.dispatch_paused_until = time.monotonic() + DISPATCH_PAUSE

    async def _sweep(self) -> None:
        """Answer queued requests that went stale, expired or waited too long."""
        now = time.time()
        q = self.queue
        # Every tenant served so far, queued or not: an empty queue reads 0, not no data.
        self.queue_gauges.record(q.counters.keys(), q.depth, lambda t: q.counters.get(t, 0.0))
        waiting = [(item.payload, item.enqueued_at) for item in self.queue.items()]
        waiting += [(queued, queued.received) for queued in self.decoding.values()]
        for queued, since in waiting:
            req, msg = queued.req, queued.msg
            refusal = verdict(req, now, newest=self.newest.newest(req), where="while queued")
            if refusal is None and now - since > self.s.max_queue_seconds:
                waited = f"queued over {self.s.max_queue_seconds:.0f}s"
                refusal = Refusal("rejected", "timeout", waited)
            if refusal is None:
                continue
            self.queue.remove(req.id)
            self.decoding.pop(req.id, None)
            self.admission.finished(req.id, None)
            with bind_request(req.id, req.tenant, req.trace):
                await self._refuse(req, msg, refusal)

    # -- results, cancels, keepalive ----------------------------------------------------

    async def _on_result(self, msg: Msg) -> None:
        self._take_result(msg.data, live=True)

    def _take_result(self, data: bytes, *, live: bool) -> None:
        """A message on `res.>`: a result releases its dispatch (`credit`); anything else
        there (another workload's answer) is passed over. `live`: heard as published, not
        read back from RES."""
        result = read_result(data, self.s.max_message_bytes)
        if result is not None:
            if live and result.worker is not None:
                # The worker that ran it (not the dispatch's: a request redelivered from a
                # dead worker's partition is answered by its new owner).
                self.fleet.heard_from(result.worker, time.time())
            self._release(self.ledger.take(result, live=live))

    def _release(self, release: Release | None) -> None:
        """A dispatch ended: its worker's credit comes back (the ledger forgot it), and its
        tenant's reservation, charged the output tokens it used."""
        if release is None:
            return
        out = release.dispatch
        self.admission.finished(release.request_id, release.used)
        self.queue.settle(out.tenant, out.max_tokens, release.used)
        self.wake.set()

    async def _read_missed_results(self) -> int:
        """Read RES back for results published while the connection was down (`credit`),
        taking each as if heard. Returns how many dispatches this released."""
        since = self.ledger.missed_since()
        if since is None:
            return 0
        before = len(self.ledger.outstanding)
        window = streamread.Window(subject=subjects.RES_ALL, since=since)
        async for stored in streamread.read(self.bus.js, "RES", window):
            self._take_result(stored.data, live=False)
            if not self.ledger.outstanding:
                break
        return before - len(self.ledger.outstanding)

    async def _take_earlier_result(self, req: GenerateRequest) -> None:
        """WORK already held this request: it was dispatched before, by this router (its
        REQ message came again, the ack lost in a failover) or by one that died before
        acking it. It runs, or ran, once; if it ran, its result was published before this
        dispatch was registered: read RES for it (else it is still to come, and is heard
        as usual), taking every result read as if heard."""
        since = self.ledger.earlier_since(req.id)
        window = streamread.Window(subject=subjects.res(req.workload, req.tenant), since=since)
        try:
            async for stored in streamread.read(self.bus.js, "RES", window):
                self._take_result(stored.data, live=False)
                if req.id not in self.ledger:
                    log.info("router.earlier_result_taken")
                    return
        except Exception as exc:  # RES has no leader: the backstop releases it in the end
            log.warning("router.earlier_result_unread", error=repr(exc))

    async def _on_cancel(self, msg: Msg) -> None:
        request_id = msg.subject.split(".", 1)[1]
        item = self.queue.remove(request_id)
        queued = item.payload if item is not None else self.decoding.pop(request_id, None)
        if queued is None:
            # It may still be on its way to us (a decode stage too: its prefill runs).
            self.cancelled.add(request_id)
            return  # running requests: the owning worker hears the same cancel
        req = queued.req
        self.admission.finished(req.id, None)
        with bind_request(req.id, req.tenant, req.trace):
            while_queued = Refusal("cancelled", "cancelled", "cancelled while queued")
            await self._refuse(req, queued.msg, while_queued)

    async def _on_newest(self, msg: Msg) -> None:
        """Another router (or this one) admitted a session's newer step: older ones queued
        here are answered at the next sweep."""
        try:
            notice = decode(msg.data, NewestStep, max_bytes=self.s.max_message_bytes)
        except DecodeError:
            return
        if self.newest.see(notice.tenant, notice.session, notice.step):
            self.wake.set()

    async def _keepalive_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.s.req_ack_wait / 3)
            held = [item.payload.msg for item in self.queue.items()]
            for msg in held + [queued.msg for queued in self.decoding.values()]:
                with contextlib.suppress(Exception):
                    await msg.in_progress()
            reconnects = self.bus.nc.stats["reconnects"]
            if reconnects != self.reconnects_seen:
                try:
                    settled = await self._read_missed_results()
                except Exception as exc:  # RES has no leader yet: the next round tries again
                    log.warning("router.missed_results_unread", error=repr(exc))
                else:
                    self.reconnects_seen = reconnects
                    log.info("router.missed_results_read", settled=settled)
            now = time.time()
            for expired in self.ledger.expire():  # never heard nor read back
                out, age = expired.dispatch, round(now - expired.dispatch.at, 1)
                log.warning("router.result_unheard", request_id=expired.request_id,
                            tenant=out.tenant, worker=out.worker, age=age)  # fmt: skip
                self._release(expired)
            for affinity in self.affinity.values():
                affinity.expire(now)
            for session in [s for s, at in self.warm.items() if now - at > self.s.warm_seconds]:
                del self.warm[session]

    # -- placement -----------------------------------------------------------------------

    async def _placement_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._rebalance()
            except UNAVAILABLE as exc:  # KV has no leader for a moment: the next round retries
                log.warning("router.rebalance_failed", error=repr(exc))
            except Exception:
                log.exception("router.rebalance_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.s.rebalance_interval)

    async def _rebalance(self) -> None:
        await self.fleet.refresh_workers()
        for pool, placement in self.placements.items():
            # Partitions only carry requests to their worker: a count share per slot is
            # all they need. Load is balanced per session, at dispatch (`affinity`).
            moves = placement.reconcile(self.fleet.views(pool))
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
