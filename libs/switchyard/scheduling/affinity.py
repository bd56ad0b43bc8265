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
   It moves only when that worker has been **overloaded** — load per slot above
   (1 + `epsilon`) x the pool's mean — continuously for `hold` seconds, the session has
   not moved in the last `cooldown` seconds, and somewhere is below the mean. After a move
   the worker's overload clock starts again, so an overloaded worker sheds one session per
   `hold`: load that is uneven for a moment moves nothing, and no session bounces back.
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

`least_loaded` (least load per slot, no memory) and `round_robin` are the baselines
`sy bench route` compares it with.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Sequence
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

    @property
    def has_credit(self) -> bool:
        return self.credit > 0

    @property
    def per_slot(self) -> float:
        return self.load / self.slots


@dataclass
class Route:
    """A session's worker. `written`: when the KV entry was last written (it expires
    `ttl` after that); `moved`: when the session last changed worker."""

    worker: str
    written: float
    moved: float


@dataclass(frozen=True)
class Decision:
    worker: str
    reason: Reason
    session: str | None
    write: bool  # the session's KV entry must be (re)written: new, moved or due a refresh
    work: float  # what it adds to the chosen worker's load (see the module docstring)
    left: str | None = None  # the overloaded worker it moved off, for a move for load


@dataclass
class Affinity:
    policy: Policy = "switchyard"
    epsilon: float = 0.25
    hold: float = 2.0
    cooldown: float = 30.0
    ttl: float = 600.0
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
    _index: OrderedDict[bytes, dict[str, float]] = field(default_factory=OrderedDict)
    _turn: int = 0

    # -- what the router tells it --------------------------------------------------------

    def observe(self, workers: Sequence[WorkerLoad], now: float) -> None:
        """Track which workers are overloaded and since when (call once per round)."""
        mean = _mean(workers)
        over = {w.worker for w in workers if mean > 0 and w.per_slot > (1 + self.epsilon) * mean}
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
        blocks: Sequence[Block], now: float,
    ) -> Decision | None:  # fmt: skip
        """The worker for a request of `prompt` tokens asking for up to `output`, or None
        when it must wait (nobody eligible has credit). Pure: `commit` records a dispatched
        decision."""
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
        return self._switchyard(workers, eligible, free, prompt, output, session, blocks, now)

    def _work(self, prompt: int, output: int, cached: int) -> float:
        """What a request adds to a worker that holds `cached` of its prompt tokens."""
        return output + max(0, prompt - cached) / self.prompt_tokens_per_output_token

    def _switchyard(
        self, workers: Sequence[WorkerLoad], eligible: list[WorkerLoad], free: list[WorkerLoad],
        prompt: int, output: int, session: str | None, blocks: Sequence[Block], now: float,
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
        best = self._best(free, prompt, output, blocks, now, key, session is not None, away)
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
        total_slots = sum(w.slots for w in eligible)
        mean_after = (sum(w.load for w in eligible) + work) / total_slots
        if home.per_slot <= (1 + self.epsilon) * mean_after:
            return False
        return any(
            w.has_credit and w.worker != home.worker and (w.load + work) / w.slots <= mean_after
            for w in eligible
        )

    def _best(
        self, free: list[WorkerLoad], prompt: int, output: int, blocks: Sequence[Block],
        now: float, key: str, new_session: bool, away: str | None,
    ) -> tuple[WorkerLoad, float] | None:  # fmt: skip
        """The cheapest worker (see the module docstring) and the load it would take on."""
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

        pick = min(within, key=cost)
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
        for block in blocks:
            holders = self._index.get(block.digest)
            if holders is None:
                holders = self._index[block.digest] = {}
            else:
                self._index.move_to_end(block.digest)
            holders[decision.worker] = now
        while len(self._index) > self.prefix_capacity:
            self._index.popitem(last=False)


def _mean(workers: Sequence[WorkerLoad]) -> float:
    slots = sum(w.slots for w in workers)
    return sum(w.load for w in workers) / slots if slots else 0.0


def _least(w: WorkerLoad) -> tuple[float, str]:
    return (w.per_slot, w.worker)


def _rendezvous(key: str, worker: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{worker}".encode(), digest_size=8).digest())
