"""The router's credit ledger: what each request it dispatched holds until its result is
heard, and when that comes back.

A dispatch holds one unit of its worker's credit and `tokens` of its load, and keeps its
tenant's concurrency slot and `max_tokens` reservation (in `admission` and the fair queue)
until it is released, charged the output tokens it used:
- by its result, heard on `res.>` as it is published, or read back from RES: results come
  on a core-NATS subscription, so those published while the connection was down never
  arrive (RES is read back from the oldest dispatch still held), and a dispatch WORK acks
  as a duplicate ran before, its result stored before this dispatch was registered (RES is
  read from its request's creation). A result taken twice (heard and read back, or
  published twice) releases once: the second finds no dispatch;
- or, heard by neither, by the backstop, charged every token it could have used.

A worker's credit is `slots x credit_per_slot` less what it holds: the larger of what this
router dispatched to it without a result yet and its heartbeat's `queued` (others'
requests too, redeliveries), less the results it published after that heartbeat. Without
that discount a finished request kept its credit until the next heartbeat, up to
`heartbeat_interval` of idle GPU.

Pure, with an injected clock; the router wires it to the bus.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from switchyard.codec import decode
from switchyard.envelope import RequestId, ShortText, UnixTime
from switchyard.errors import DecodeError
from switchyard.ids import id_time
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.messages.inference import GenerateResult
from switchyard.scheduling.affinity import WorkerLoad

# RES is read back from this long before the dispatch or request a result answers: the
# router's clock and the server's may differ a little.
CLOCK_SLACK = 5.0
# A dispatch is given up this long after it at the least (`backstop`).
MIN_BACKSTOP = 600.0

RESULT_KIND = GenerateResult.model_fields["kind"].default


def backstop(max_queue_seconds: float) -> float:
    """How long a dispatch waits for its result before it is given up: ten times the
    longest a request may queue, never under `MIN_BACKSTOP`."""
    return max(MIN_BACKSTOP, 10 * max_queue_seconds)


class _View(BaseModel):
    # Open, unlike the message models: what a view does not name is passed over unread.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _Usage(_View):
    completion_tokens: int = Field(default=0, ge=0)


class _Route(_View):
    finished_at: UnixTime


class ResultView(_View):
    """What the ledger reads of a message on `res.>`: its `kind`, so another workload's
    answer there (a `SqlAnswer` on `res.sql.<t>`, beside its model calls' results) is
    passed over, never misread; and of a `GenerateResult` its request, output tokens and
    worker. Every other field is left unread, so a result with fields added later reads
    the same."""

    kind: str
    request_id: RequestId
    worker: ShortText | None = None
    usage: _Usage = _Usage()
    route: _Route | None = None


def read_result(data: bytes, max_bytes: int) -> ResultView | None:
    """The `GenerateResult` in `data` as the ledger reads it; None for anything else."""
    try:
        view = decode(data, ResultView, max_bytes=max_bytes)
    except DecodeError:
        return None
    return view if view.kind == RESULT_KIND else None


@dataclass(frozen=True)
class Dispatch:
    """A request dispatched to a worker, its result not yet taken."""

    pool: str
    worker: str
    tenant: str
    max_tokens: int
    tokens: float  # what it adds to its worker's load (`Decision.work`)
    at: float
    decode: bool = False  # a disaggregated request's decode stage (#39), not its first


@dataclass(frozen=True)
class Release:
    """A dispatch's end: its tenant is charged `used` of the `max_tokens` reserved."""

    request_id: str
    dispatch: Dispatch
    used: int


@dataclass
class Ledger:
    clock: Callable[[], float]
    credit_per_slot: int
    backstop: float
    outstanding: dict[str, Dispatch] = field(default_factory=dict)
    # Per worker, the results heard as published since its last heartbeat (request id ->
    # finish time, the worker's clock): that heartbeat's `queued` still counts them. By
    # id, so a result published twice is discounted once.
    _answered: dict[str, dict[str, float]] = field(default_factory=dict)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.outstanding

    def dispatch(
        self, request_id: str, pool: str, worker: str, tenant: str, max_tokens: int,
        tokens: float, *, decode: bool = False,
    ) -> None:  # fmt: skip
        """Registered before the WORK publish: a fast engine can answer while its ack is
        still awaited, and a result for a request not yet registered would be dropped and
        its credit and concurrency held forever."""
        self.outstanding[request_id] = Dispatch(
            pool, worker, tenant, max_tokens, tokens, self.clock(), decode
        )

    def decoding(self, request_id: str) -> bool:
        """Its decode stage is dispatched (a handoff heard again is one it already took)."""
        out = self.outstanding.get(request_id)
        return out is not None and out.decode

    def undispatch(self, request_id: str) -> None:
        """The WORK publish failed: nothing was sent, nothing is held."""
        self.outstanding.pop(request_id, None)

    def take(self, result: ResultView, *, live: bool) -> Release | None:
        """A result: its dispatch's release, or None when it has none here (another
        router's, or taken already). `live`: heard as published, not read back from RES,
        so it also counts against its worker's last heartbeat."""
        if live and result.worker is not None and result.route is not None:
            self._answered_by(result.worker, result.request_id, result.route.finished_at)
        out = self.outstanding.pop(result.request_id, None)
        if out is None:
            return None
        return Release(result.request_id, out, result.usage.completion_tokens)

    def handed_off(self, request_id: str, worker: str, at: float) -> None:
        """A prefill stage ended (#39), its decode stage handed back by `worker` (at `at`,
        its clock): the prefill's credit comes back as a result's would (whoever ran it:
        a dead worker's prefill runs again where its partition moved), and its tenant
        keeps what it reserved until the decode stage's result."""
        self._answered_by(worker, request_id, at)
        if not self.decoding(request_id):
            self.outstanding.pop(request_id, None)

    def _answered_by(self, worker: str, request_id: str, at: float) -> None:
        self._answered.setdefault(worker, {})[request_id] = at

    def expire(self) -> list[Release]:
        """Give up on hearing the results of dispatches older than the backstop (answered
        while RES could not be read, or never): their worker's credit comes back, and
        their tenant's slot, charged every token they could have used (as the fair queue
        was at dispatch)."""
        cutoff = self.clock() - self.backstop
        expired = {rid: out for rid, out in self.outstanding.items() if out.at < cutoff}
        for rid in expired:
            del self.outstanding[rid]
        return [Release(rid, out, out.max_tokens) for rid, out in expired.items()]

    def missed_since(self) -> float | None:
        """Where RES is read back from after a reconnect: any result still missing was
        published after the oldest dispatch held. None: nothing is held."""
        if not self.outstanding:
            return None
        return min(out.at for out in self.outstanding.values()) - CLOCK_SLACK

    @staticmethod
    def earlier_since(request_id: str) -> float:
        """Where RES is read from for the earlier result of a duplicate dispatch: it was
        published after its request was made."""
        return id_time(request_id) - CLOCK_SLACK

    def loads(self, pool: str, heartbeats: Iterable[WorkerHeartbeat]) -> dict[str, WorkerLoad]:
        """The load in tokens and the credit of each worker of `pool` heard from in
        `heartbeats` (its latest)."""
        count: dict[str, int] = {}
        tokens: dict[str, float] = {}
        for out in self.outstanding.values():
            if out.pool == pool:
                count[out.worker] = count.get(out.worker, 0) + 1
                tokens[out.worker] = tokens.get(out.worker, 0.0) + out.tokens
        loads: dict[str, WorkerLoad] = {}
        for hb in heartbeats:
            answered = self._answered.get(hb.worker, {})
            for rid in [rid for rid, at in answered.items() if at <= hb.at]:
                del answered[rid]  # the heartbeat counts it no more
            held = max(count.get(hb.worker, 0), hb.queued - len(answered))
            credit = hb.slots * self.credit_per_slot - held
            loads[hb.worker] = WorkerLoad(
                hb.worker, hb.slots, tokens.get(hb.worker, 0.0), hb.draining, credit,
                hb.kv_capacity_tokens, hb.kv_cache_usage,
            )  # fmt: skip
        return loads
