"""Which worker serves a request: sticky per session, prefix-aware without one, bounded by load.

Partitions are only the delivery channel (`placement.Placement` gives every live worker
its share of them); this module decides the worker, per request, from

- a worker's **load**: the GPU time it owes, per engine slot, counted in output tokens:
  of every request dispatched to it and not yet answered, its output (`max_tokens`)
  plus the prompt tokens it must compute (not those it holds cached) at
  `prompt_tokens_per_output_token` to one. Tokens, not requests: a 192-token answer is
  not a 32-token one, an 8k-token prompt the worker must prefill is not one it has
  cached. A GPU's busy time follows this, where prompt + output (the KV a request holds)
  does not: a long conversation's cached history costs memory, hardly time;
- a **session table** (session -> worker), mirrored from JetStream KV by the router so a
  second router and a restarted one agree; entries expire after `ttl` unless refreshed;
- a **prefix index** (chained hashes of the prompt's leading blocks -> workers that were
  recently sent them), the approximate radix tree of SGLang's cache-aware router and
  llm-d's prefix scorer. Each router keeps its own; it is a hint, never a correctness matter.
  It also finds a chat **conversation** without a session: a prompt whose messages up to
  its last assistant message are exactly a prompt a worker was sent is that prompt's
  next turn, and that worker holds its history.

The shipped policy, `switchyard`:

1. A request of a session whose worker is live and not draining goes to that worker.
   It moves only when that worker has been **overloaded** — its load per slot, averaged
   over the last `window` seconds, above (1 + `epsilon`) x the pool's mean of the same,
   and above the mean by at least this request's work (shedding less than the excess
   only moves it) — continuously for `hold` seconds, is over the bound at this instant
   too, the session has not moved in the last `cooldown` seconds, and somewhere is
   below the mean. After a move
   the worker's overload clock starts again, so an overloaded worker sheds one session per
   `hold`: load that is uneven for a moment moves nothing, and no session bounces back.
   The average is what tells an overloaded worker from a noisy one: the load a router sees
   is the steps in flight, a few per worker between the phones' actions, so a worker is
   15 % over the mean half the time by chance alone, and for 2 s at a time often enough:
   judged instant by instant, `sy bench route --workload agent` in real time
   (`--delay-scale 1.0`) moved sessions for nothing (stickiness 0.90-0.96 at imbalance
   1.02), where at 0.25 the same 2 s hold lasted four times as long in the workload's own
   time and nothing moved.
2. A conversation's next turn (a request without a session that extends a prompt a
   worker was sent, see above) stays on that worker by the same rule: it moves only when
   the worker has been overloaded for `hold` seconds, and then the worker's overload
   clock starts again. Moving it would recompute its whole history.
3. Anything else (a new session, a session whose worker died or drains, a request without
   a session that continues nothing) goes to the worker that would serve it at least
   cost: the least (load + this request + `prefix_weight` x the prompt tokens it has not
   cached) per slot, among
   workers whose load is within the bound; when none is within it, the least loaded. A
   conversation's next turn finds the worker that holds its history; a tenant's system
   prompt, once many workers hold it, no longer decides, so a hot tenant spreads as its
   load needs. For a new session a worker's load counts each session already routed
   there as one such request in flight: sessions stay, and an idle instant between
   their steps must not pile new ones onto one worker. A prompt whose prefix a
   worker holds goes there while that worker has room, and a hot prefix (one tenant's
   system prompt) spreads over as many workers as its load needs.

KV headroom. A session's next step reuses the prefix its last one left in its worker's KV
cache; an episode placed where the cache cannot also hold it evicts the prefixes of the
sessions already there (LRU), and their next steps compute them again. So a new session
(or one that must move) goes only to a worker whose **room** holds its window, when some
worker's does: room = the KV capacity the worker's heartbeat reports (its engine's, in
tokens) less the larger of what its running sequences use (the engine's KV usage) and
the windows of the **active** sessions routed there. A session's window is what its
steps keep cached (its producer's estimate, `GenerateRequest.kv_window_tokens`: system
prompt, every frame its layout holds, history, answer; else its prompt and answer), and
it is active while its last step was dispatched less than twice its last interval
between steps ago (an episode is a closed loop: its next step is due one interval on),
or `active_s` seconds before its second step - the rule the sim engine counts its
evictions of active sessions by (`engines.sim`). When no worker has room, the one with
the most. Sessions already placed stay sticky: a full cache is no reason to move one.

`least_loaded` (least load per slot, no memory) and `round_robin` are the baselines
`sy bench route` compares it with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from switchyard.agentprompt import PATCH_PX, visual_tokens
from switchyard.messages.inference import ChatMessage, Image, TextPart
from switchyard.token_estimate import FRAMING_TOKENS, estimate_text_tokens

Policy = Literal["switchyard", "least_loaded", "round_robin"]
POLICIES: tuple[Policy, ...] = ("round_robin", "least_loaded", "switchyard")

Reason = Literal["sticky", "new", "prefix", "dead", "drain", "load"]

# Prompt tokens that cost a GPU as much time as one output token: prefill is compute-bound,
# 0.11 ms of the whole A100 per token (the sim's calibration; ~10k tokens/s for a 7-8B
# model), while an output token costs its share of a batched decode step, 13.4-16.4 ms
# over the ~10-25 sequences a busy worker batches here: ~1 ms. Measured with
# `sy bench route` (A100 sim, GPU busy time): 100 (an output token as a whole step)
# left agent steps at p50 1,460 ms, 10 at 1,383 ms, chat balance 1.06 -> 1.03.
PROMPT_TOKENS_PER_OUTPUT_TOKEN = 10.0

BLOCK_CHARS = 256  # ~64-85 tokens: the granularity at which prefixes are compared
MAX_BLOCKS = 256  # a prompt's first 64k characters are enough to tell prefixes apart
IMAGE_TOKENS_UNKNOWN = 256  # an image part whose size the request does not carry


@dataclass(frozen=True)
class Block:
    digest: bytes  # chained: names this block and everything before it
    tokens: int  # estimated prompt tokens up to and including this block
    turns: int = 0  # assistant messages begun up to and including this block


def prefix_blocks(
    salt: str, messages: Sequence[ChatMessage] | None, prompt: str | None,
    images: Sequence[Image] = (), patch: int = PATCH_PX,
) -> list[Block]:  # fmt: skip
    """The prompt's leading blocks as chained hashes, rooted in `salt` (the tenant's cache
    group) so two tenants' identical prompts never share a prefix here either. Images
    weigh their visual tokens of `patch` px (the request's VLM profile)."""
    sizes = {im.hash: visual_tokens(im.width, im.height, patch) for im in images}
    blocks: list[Block] = []
    digest = hashlib.blake2b(salt.encode(), digest_size=16).digest()
    tokens = turns = 0

    def add(piece: bytes, weight: int) -> bool:
        nonlocal digest, tokens
        digest = hashlib.blake2b(digest + piece, digest_size=16).digest()
        tokens += weight
        blocks.append(Block(digest, tokens, turns))
        return len(blocks) < MAX_BLOCKS

    def text(value: str) -> bool:
        for i in range(0, len(value), BLOCK_CHARS):
            chunk = value[i : i + BLOCK_CHARS]
            if not add(b"t" + chunk.encode(), estimate_text_tokens(chunk)):
                return False
        return True

    if prompt is not None:
        text(prompt)
        return blocks
    for message in messages or ():
        turns += message.role == "assistant"
        if not add(b"m" + message.role.encode(), FRAMING_TOKENS):
            return blocks
        content = message.content
        parts = [TextPart(text=content)] if isinstance(content, str) else content
        for part in parts:
            if isinstance(part, TextPart):
                if not text(part.text):
                    return blocks
            elif not add(b"i" + part.hash.encode(), sizes.get(part.hash, IMAGE_TOKENS_UNKNOWN)):
                return blocks
    return blocks


def previous_turn(blocks: Sequence[Block]) -> Block | None:
    """A conversation's last block before its last assistant message: the end of the
    prompt its previous turn was (None when the prompt has no assistant message)."""
    last = blocks[-1].turns if blocks else 0
    if last == 0:
        return None
    return next((b for b in reversed(blocks) if b.turns < last), None)


@dataclass(frozen=True)
class WorkerLoad:
    """A live worker as the router sees it at this instant."""

    worker: str
    slots: int
    load: float  # tokens being served (see the module docstring)
    draining: bool = False
    credit: int = 1  # requests it may still be sent now
    kv_tokens: int = 0  # its engine's KV cache capacity in tokens (0: not reported)
    kv_usage: float = 0.0  # the share of it that running sequences hold (engine's figure)

    @property
    def has_credit(self) -> bool:
        return self.credit > 0

    @property
    def per_slot(self) -> float:
        return self.load / self.slots


@dataclass
class Route:
    """A session's worker. `written`: when the KV entry was last written (it expires
    `ttl` after that); `moved`: when the session last changed worker; `window`: the KV
    tokens its steps keep cached, `seen` when its last step was dispatched and `interval`
    the time between its last two (None until this router saw one, or two, of its steps)."""

    worker: str
    written: float
    moved: float
    window: int = 0
    seen: float | None = None
    interval: float | None = None


@dataclass(frozen=True)
class Decision:
    worker: str
    reason: Reason
    session: str | None
    write: bool  # the session's KV entry must be (re)written: new, moved or due a refresh
    work: float  # what it adds to the chosen worker's load (see the module docstring)
    left: str | None = None  # the overloaded worker it moved off, for a move for load
    window: int = 0  # KV tokens the session keeps cached on its worker (module docstring)


@dataclass
class Affinity:
    policy: Policy = "switchyard"
    epsilon: float = 0.25
    hold: float = 2.0
    cooldown: float = 30.0
    ttl: float = 600.0
    # Seconds the load that judges overload is averaged over (an exponential moving
    # average with this time constant), many of a phone's step cycles (the route bench's:
    # 8 s of acting + ~1 s of step), so its steps' coming and going averages out. My own
    # estimate, from a model of the steps in flight (each worker's a Poisson stream of
    # 3 steps/s lasting 0.9 s, 64 sessions, 10 minutes): judged instantly, ~125 moves;
    # averaged over 10 s ~30, 20 s ~1, 30 s none, and a worker 1.5x the others' load
    # still sheds its first session as soon as its sessions' `cooldown` allows. Checked
    # with `sy bench route` (module docstring).
    window: float = 30.0
    # Seconds a session with one step so far stays active (its interval unknown): the
    # router's `warm_seconds` and the sim's `active_session_s`.
    active_s: float = 30.0
    # What a prompt token a worker would compute again costs, in units of load (output
    # tokens), for a request that continues nothing, on top of its GPU time
    # (1 / PROMPT_TOKENS_PER_OUTPUT_TOKEN): a hot tenant's system prompt draws its
    # one-shots and first turns to the workers holding it only while their load is near
    # the others'. Conversations keep their worker by rule 2, not by this weight.
    # Measured on `sy bench route --workload chat` (A100 sim): 4 kept tenants on 3-4 of
    # 8 workers at busy-time imbalance 1.23-1.38; 0.1 spreads them over 5-8 at 1.03-1.06,
    # the same 73 % hit rate (a system prompt, once on every worker, is cached there).
    prefix_weight: float = 0.1
    prompt_tokens_per_output_token: float = PROMPT_TOKENS_PER_OUTPUT_TOKEN
    prefix_ttl: float = 300.0  # an index entry older than this is assumed evicted
    prefix_capacity: int = 200_000  # index entries kept (least recently used go first)
    routes: dict[str, Route] = field(default_factory=dict)  # change with _set/_drop only
    _on: Counter[str] = field(default_factory=Counter)  # sessions routed to each worker
    _over_since: dict[str, float] = field(default_factory=dict)
    _smooth: dict[str, tuple[float, float]] = field(default_factory=dict)  # (load/slot, at)
    _excess: dict[str, float] = field(default_factory=dict)  # averaged load/slot over the mean
    _index: OrderedDict[bytes, dict[str, float]] = field(default_factory=OrderedDict)
    _turn: int = 0

    # -- what the router tells it --------------------------------------------------------

    def observe(self, workers: Sequence[WorkerLoad], now: float) -> None:
        """Average each worker's load per slot over `window`, and track which workers are
        overloaded by that average and since when (call once per round)."""
        smooth: dict[str, tuple[float, float]] = {}
        for w in workers:
            seen = self._smooth.get(w.worker)
            if seen is None or self.window <= 0:
                smooth[w.worker] = (w.per_slot, now)
                continue
            value, at = seen
            k = 1.0 - math.exp(-max(0.0, now - at) / self.window)
            smooth[w.worker] = (value + k * (w.per_slot - value), now)
        self._smooth = smooth
        slots = sum(w.slots for w in workers)
        mean = sum(smooth[w.worker][0] * w.slots for w in workers) / slots if slots else 0.0
        bound = (1 + self.epsilon) * mean
        over = {w.worker for w in workers if mean > 0 and smooth[w.worker][0] > bound}
        self._excess = {w: smooth[w][0] - mean for w in over}
        self._over_since = {w: self._over_since.get(w, now) for w in over}

    def learn(self, session: str, worker: str, written: float, *, adopt: bool = False) -> None:
        """A session route read from KV (written by this router or another). `adopt`: it
        won a race against this router's own newer decision, so it replaces that one."""
        known = self.routes.get(session)
        if known is not None and known.worker == worker:
            known.written = max(known.written, written)
            return
        if known is not None and known.written > written and not adopt:
            return  # older than what this router decided since (its own write, echoed late)
        self._set(session, Route(worker, written, written))

    def forget(self, session: str) -> None:
        self._drop(session)

    def _set(self, session: str, route: Route) -> None:
        self._drop(session)
        self.routes[session] = route
        self._on[route.worker] += 1

    def _drop(self, session: str) -> None:
        route = self.routes.pop(session, None)
        if route is not None:
            self._on[route.worker] -= 1
            if self._on[route.worker] <= 0:
                del self._on[route.worker]

    def expire(self, now: float) -> int:
        """Drop routes past their TTL (KV has dropped them too); how many."""
        stale = [s for s, r in self.routes.items() if now - r.written > self.ttl]
        for session in stale:
            self._drop(session)
        return len(stale)

    # -- the decision ----------------------------------------------------------------------

    def choose(
        self, workers: Sequence[WorkerLoad], prompt: int, output: int, session: str | None,
        blocks: Sequence[Block], now: float, window: int | None = None,
        near: Callable[[str], int] | None = None,
    ) -> Decision | None:  # fmt: skip
        """The worker for a request of `prompt` tokens asking for up to `output`, or None
        when it must wait (nobody eligible has credit); `window`: the KV tokens its session
        keeps cached (None: prompt + output); `near`: a worker's distance from where the
        request's KV is (a decode stage's, scheduling/links.py), which picks first among
        the workers its load allows (a sticky session keeps its worker). Pure: `commit`
        records a dispatched decision."""
        kv = window if window is not None else prompt + output
        eligible = [w for w in workers if not w.draining]
        if not eligible:
            return None
        free = [w for w in eligible if w.has_credit]
        if self.policy == "round_robin":
            free.sort(key=lambda w: w.worker)
            if not free:
                return None
            pick = free[self._turn % len(free)].worker
            return Decision(pick, "new", session, False, self._work(prompt, output, 0))
        if self.policy == "least_loaded":
            if not free:
                return None
            pick = min(free, key=_least).worker
            return Decision(pick, "new", session, False, self._work(prompt, output, 0))
        decision = self._switchyard(workers, eligible, free, prompt, output, session, blocks, now,
                                    kv, near)  # fmt: skip
        return dataclasses.replace(decision, window=kv) if decision is not None else None

    def _work(self, prompt: int, output: int, cached: int) -> float:
        """What a request adds to a worker that holds `cached` of its prompt tokens."""
        return output + max(0, prompt - cached) / self.prompt_tokens_per_output_token

    def _switchyard(
        self, workers: Sequence[WorkerLoad], eligible: list[WorkerLoad], free: list[WorkerLoad],
        prompt: int, output: int, session: str | None, blocks: Sequence[Block], now: float,
        kv: int, near: Callable[[str], int] | None,
    ) -> Decision | None:  # fmt: skip
        home: WorkerLoad | None = None
        reason: Reason = "new" if session is not None else "prefix"
        route = self.routes.get(session) if session is not None else None
        if route is not None and now - route.written > self.ttl:
            route = None
        if route is not None:
            home = next((w for w in eligible if w.worker == route.worker), None)
            if home is None:
                drains = any(w.worker == route.worker and w.draining for w in workers)
                reason = "drain" if drains else "dead"
        elif session is None:
            home = self._conversation(blocks, eligible, now)
        if home is not None:
            held = self._cached(blocks, {home.worker}, now).get(home.worker, 0)
            work = self._work(prompt, output, held)
            recent = route is not None and now - route.moved < self.cooldown
            if recent or not self._overloaded(home, eligible, work, now):
                refresh = route is not None and now - route.written > self.ttl / 2
                return Decision(home.worker, "sticky", session, refresh, work)
            reason = "load"
        key = session if session is not None else (blocks[0].digest.hex() if blocks else "")
        away = home.worker if home else route.worker if route else None
        if session is not None:
            free = self._with_room(free, kv, now)
        best = self._best(free, prompt, output, blocks, now, key, session is not None, away,
                          near)  # fmt: skip
        if best is None:
            return None
        pick, work = best
        left = home.worker if home is not None else None
        return Decision(pick.worker, reason, session, session is not None, work, left)

    def _conversation(
        self, blocks: Sequence[Block], eligible: list[WorkerLoad], now: float
    ) -> WorkerLoad | None:
        """The live worker most recently sent this conversation's previous turn, if any."""
        end = previous_turn(blocks)
        holders = self._index.get(end.digest) if end is not None else None
        if not holders:
            return None
        live = {w.worker: w for w in eligible}
        fresh = [(seen, w) for w, seen in holders.items() if w in live]
        if not fresh or now - max(fresh)[0] > self.prefix_ttl:
            return None
        return live[max(fresh)[1]]

    def _overloaded(
        self, home: WorkerLoad, eligible: list[WorkerLoad], work: float, now: float
    ) -> bool:
        """`home` has been above the bound for `hold` seconds, still is with this request
        counted, and some worker with credit would stay at or below the mean with it."""
        since = self._over_since.get(home.worker)
        if since is None or now - since < self.hold:
            return False
        # Shedding less than the excess only moves it: the average must be over the mean
        # by this request's work at least (a few steps in flight per worker are many
        # times 15 % of the mean by chance).
        if self._excess.get(home.worker, 0.0) < work / home.slots:
            return False
        total_slots = sum(w.slots for w in eligible)
        mean_after = (sum(w.load for w in eligible) + work) / total_slots
        if home.per_slot <= (1 + self.epsilon) * mean_after:
            return False
        return any(
            w.has_credit and w.worker != home.worker and (w.load + work) / w.slots <= mean_after
            for w in eligible
        )

    def is_active(self, route: Route, now: float) -> bool:
        """Whether the session of `route` is active (see the module docstring)."""
        if route.seen is None:
            return False
        span = 2 * route.interval if route.interval is not None else self.active_s
        return now - route.seen <= span

    def room(self, workers: Sequence[WorkerLoad], now: float) -> dict[str, float]:
        """KV tokens each worker that reports its capacity can still cache without
        evicting an active session's prefix (see the module docstring)."""
        held: Counter[str] = Counter()
        for route in self.routes.values():
            if route.window and self.is_active(route, now):
                held[route.worker] += route.window
        return {
            w.worker: w.kv_tokens - max(held[w.worker], w.kv_usage * w.kv_tokens)
            for w in workers
            if w.kv_tokens > 0
        }

    def _with_room(self, free: list[WorkerLoad], kv: int, now: float) -> list[WorkerLoad]:
        """The workers of `free` whose room holds a session's `kv` tokens (a worker that
        reports no capacity is taken to have room); when none, the one with the most."""
        room = self.room(free, now)
        fits = [w for w in free if room.get(w.worker, math.inf) >= kv]
        if fits or not free:
            return fits
        return [max(free, key=lambda w: (room.get(w.worker, math.inf), w.worker))]

    def _best(
        self, free: list[WorkerLoad], prompt: int, output: int, blocks: Sequence[Block],
        now: float, key: str, new_session: bool, away: str | None,
        near: Callable[[str], int] | None,
    ) -> tuple[WorkerLoad, float] | None:  # fmt: skip
        """The cheapest worker (see the module docstring; the nearest first, given `near`)
        and the load it would take on."""
        candidates = [w for w in free if w.worker != away] or free
        if not candidates:
            return None
        known = blocks[-1].tokens if blocks else 0
        cached = self._cached(blocks, {w.worker for w in candidates}, now)
        held = {w.worker: min(known, cached.get(w.worker, 0)) for w in candidates}
        work = {w.worker: self._work(prompt, output, held[w.worker]) for w in candidates}
        total_slots = sum(w.slots for w in candidates)
        added = self._work(prompt, output, 0)  # the bound counts it uncached: the most
        bound = (1 + self.epsilon) * (sum(w.load for w in candidates) + added) / total_slots
        within = [w for w in candidates if w.per_slot <= bound]
        if not within:
            pick = min(candidates, key=_least)
            return pick, work[pick.worker]

        def cost(w: WorkerLoad) -> tuple[float, float, int]:
            # Ties (an idle pool has many) go to the worker with the fewest sessions per
            # slot, then by a hash of key and worker: never to whoever sorts first, which
            # would stack every session of a quiet hour on one worker.
            load = w.load
            if new_session:
                # A session stays: it brings a request like this one again and again. Its
                # worker's load between steps (an idle instant) understates that, so count
                # each session routed there as at least one such request in flight.
                load = max(load, self._on[w.worker] * work[w.worker])
            uncached = self.prefix_weight * (known - held[w.worker])
            return ((load + work[w.worker] + uncached) / w.slots, self._on[w.worker] / w.slots,
                    _rendezvous(key, w.worker))  # fmt: skip

        def nearest_then_cost(w: WorkerLoad) -> tuple[int, tuple[float, float, int]]:
            return (near(w.worker) if near is not None else 0, cost(w))

        pick = min(within, key=nearest_then_cost)
        return pick, work[pick.worker]

    def _cached(self, blocks: Sequence[Block], workers: set[str], now: float) -> dict[str, int]:
        """Per worker, the tokens of the longest prefix of `blocks` it was recently sent."""
        found: dict[str, int] = {}
        for block in reversed(blocks):
            holders = self._index.get(block.digest)
            if not holders:
                continue
            for worker, seen in holders.items():
                if worker in workers and worker not in found and now - seen <= self.prefix_ttl:
                    found[worker] = block.tokens
            if len(found) == len(workers):
                break
        return found

    # -- after dispatch ----------------------------------------------------------------------

    def commit(self, decision: Decision, blocks: Sequence[Block], now: float) -> None:
        """Record a decision the router acted on: the session's route, the prefix index,
        and for a move off an overloaded worker, the restart of that worker's hold."""
        self._turn += 1
        if decision.left is not None and decision.reason == "load":
            self._over_since[decision.left] = now
        if decision.session is not None and self.policy == "switchyard":
            before = self.routes.get(decision.session)
            if before is None or before.worker != decision.worker:
                self._set(decision.session, Route(decision.worker, now, now))
            elif decision.write:
                before.written = now
            route = self.routes[decision.session]
            route.interval = now - route.seen if route.seen is not None else None
            route.seen = now
            route.window = max(route.window, decision.window)
        for block in blocks:
            holders = self._index.get(block.digest)
            if holders is None:
                holders = self._index[block.digest] = {}
            else:
                self._index.move_to_end(block.digest)
            holders[decision.worker] = now
        while len(self._index) > self.prefix_capacity:
            self._index.popitem(last=False)


def _least(w: WorkerLoad) -> tuple[float, str]:
    return (w.per_slot, w.worker)


def _rendezvous(key: str, worker: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{worker}".encode(), digest_size=8).digest())
