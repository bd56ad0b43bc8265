"""Fair queue: virtual token counters, lift on activation, priorities with aging, locality.

The VTC bound used throughout. Let U be the largest weighted cost of a single request
(`(w_in * prompt + w_out * max_tokens) / weight`) and L the locality bound. For tenants
that are continuously backlogged from the same start (equal counters), and all in the
same priority class, every pick takes a tenant whose counter is the minimum m (fair
pick) or at most m + L (warm pick), and adds at most U to it. So if every counter lies
in [m, m + U + L] before a pick, the chosen one is at most m + L + U after it, the others
did not move and the minimum did not go down: the spread stays within U + L at all times
(within U without warm picks). Counters of such tenants are exactly their served
weighted tokens, so the difference of served weighted tokens is bounded the same way —
the 2 x max(request cost) bound of VTC with the locality allowance in place of the
second U.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from switchyard.scheduling.fair import SCAN_DEPTH, FairQueue, Item

W_IN, W_OUT = 1.0, 2.0
RATE = 1_000.0  # weighted tokens served per second
SMALL = (60, 20)  # prompt, max_tokens: weighted cost 100
LARGE = (1_200, 400)  # weighted cost 2,000
_ids = itertools.count()


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def raw_cost(shape: tuple[int, int]) -> float:
    return W_IN * shape[0] + W_OUT * shape[1]


def make_queue(
    clock: Clock,
    weights: dict[str, float] | None = None,
    *,
    aging: float = 10.0,
    locality_bound: float = 4_096.0,
) -> FairQueue[None]:
    w = weights or {}
    return FairQueue(
        clock=clock,
        weight=lambda t: w.get(t, 1.0),
        w_in=W_IN,
        w_out=W_OUT,
        aging=aging,
        locality_bound=locality_bound,
    )


def item(
    tenant: str,
    shape: tuple[int, int] = SMALL,
    *,
    now: float = 0.0,
    priority: int = 0,
    partition: int = 0,
) -> Item[None]:
    return Item(
        request_id=f"{tenant}-{next(_ids)}",
        tenant=tenant,
        priority=priority,
        prompt_tokens=shape[0],
        max_tokens=shape[1],
        partition=partition,
        enqueued_at=now,
        payload=None,
    )


def always(_item: Item[None]) -> bool:
    return True


@dataclass
class Sim:
    """A server that serves one request at a time at RATE weighted tokens/s, while each
    tenant keeps `depth` requests queued (continuously backlogged)."""

    clock: Clock
    queue: FairQueue[None]
    shapes: dict[str, tuple[int, int]]
    weights: dict[str, float] = field(default_factory=dict)
    depth: int = 5
    priority: dict[str, int] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)  # weighted tokens
    raw: dict[str, float] = field(default_factory=dict)  # unweighted tokens
    log: list[tuple[float, str]] = field(default_factory=list)

    def join(self, tenant: str, shape: tuple[int, int], count: int | None = None) -> None:
        self.shapes[tenant] = shape
        for _ in range(self.depth if count is None else count):
            self.push(tenant)

    def push(self, tenant: str) -> None:
        prio = self.priority.get(tenant, 0)
        self.queue.push(item(tenant, self.shapes[tenant], now=self.clock.now, priority=prio))

    def step(
        self, warm: Callable[[Item[None]], bool] = lambda _: False, refill: bool = True
    ) -> str:
        chosen = self.queue.pick(always, warm)
        assert chosen is not None
        cost = raw_cost((chosen.prompt_tokens, chosen.max_tokens))
        weight = self.weights.get(chosen.tenant, 1.0)
        self.served[chosen.tenant] = self.served.get(chosen.tenant, 0.0) + cost / weight
        self.raw[chosen.tenant] = self.raw.get(chosen.tenant, 0.0) + cost
        self.log.append((self.clock.now, chosen.tenant))
        self.clock.now += cost / RATE
        if refill:
            self.push(chosen.tenant)
        return chosen.tenant

    def run_until(
        self,
        end: float,
        check: Callable[[Sim], None] = lambda _: None,
        warm: Callable[[Item[None]], bool] = lambda _: False,
    ) -> None:
        while self.clock.now < end:
            self.step(warm)
            check(self)


def spread(sim: Sim, tenants: list[str]) -> float:
    values = [sim.served.get(t, 0.0) for t in tenants]
    return max(values) - min(values)


# --- VTC bound -----------------------------------------------------------------------


@pytest.mark.parametrize("depth", [2, 5, 20, 200])
def test_backlogged_tenants_stay_within_the_vtc_bound(depth: int) -> None:
    clock = Clock()
    q = make_queue(clock)
    sim = Sim(clock, q, {}, depth=depth)
    sim.join("a", SMALL)
    sim.join("b", LARGE)
    bound = raw_cost(LARGE)  # U; no warm picks
    worst = 0.0

    def check(s: Sim) -> None:
        nonlocal worst
        gap = spread(s, ["a", "b"])
        assert gap <= bound, (s.clock.now, s.served)
        worst = max(worst, gap)

    sim.run_until(60.0, check)
    assert worst >= raw_cost(LARGE) - raw_cost(SMALL)  # the bound is nearly reached: not vacuous
    total = sim.served["a"] + sim.served["b"]
    assert total == pytest.approx(60.0 * RATE, abs=raw_cost(LARGE))
    assert sim.served["a"] == pytest.approx(total / 2, abs=bound)
    # Counters of continuously backlogged tenants are their served weighted tokens.
    assert q.counters == pytest.approx(sim.served)


@pytest.mark.parametrize("warm_tenant", ["a", "b"])
def test_locality_bonus_keeps_the_spread_within_cost_plus_locality_bound(
    warm_tenant: str,
) -> None:
    clock = Clock()
    locality = 4_096.0
    q = make_queue(clock, locality_bound=locality)
    sim = Sim(clock, q, {}, depth=5)
    sim.join("a", SMALL)
    sim.join("b", LARGE)
    bound = raw_cost(LARGE) + locality  # U + L
    worst = 0.0

    def check(s: Sim) -> None:
        nonlocal worst
        gap = spread(s, ["a", "b"])
        assert gap <= bound, (s.clock.now, s.served)
        worst = max(worst, gap)

    sim.run_until(60.0, check, warm=lambda i: i.tenant == warm_tenant)
    # The warm tenant really was let ahead, further than fair picks alone would allow.
    assert worst > locality
    leader = max(sim.served, key=lambda t: sim.served[t])
    assert leader == warm_tenant


def test_zero_locality_bound_gives_plain_vtc() -> None:
    clock = Clock()
    q = make_queue(clock, locality_bound=0.0)
    sim = Sim(clock, q, {}, depth=5)
    sim.join("a", SMALL)
    sim.join("b", LARGE)

    def check(s: Sim) -> None:
        assert spread(s, ["a", "b"]) <= raw_cost(LARGE)

    sim.run_until(60.0, check, warm=lambda i: i.tenant == "a")


def test_weights_give_proportional_service() -> None:
    clock = Clock()
    weights = {"a": 3.0, "b": 1.0}
    q = make_queue(clock, weights)
    sim = Sim(clock, q, {}, weights=weights, depth=5)
    shape = (300, 100)  # 500 raw tokens
    sim.join("a", shape)
    sim.join("b", shape)
    bound = max(raw_cost(shape) / w for w in weights.values())

    def check(s: Sim) -> None:
        assert spread(s, ["a", "b"]) <= bound  # in weighted tokens

    sim.run_until(60.0, check)
    assert sim.raw["a"] / sim.raw["b"] == pytest.approx(3.0, rel=0.05)


def test_three_tenants_with_mixed_sizes_and_weights() -> None:
    clock = Clock()
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    q = make_queue(clock, weights)
    sim = Sim(clock, q, {}, weights=weights, depth=4)
    shapes = {"a": SMALL, "b": LARGE, "c": (500, 250)}
    for tenant, shape in shapes.items():
        sim.join(tenant, shape)
    bound = max(raw_cost(shapes[t]) / weights[t] for t in shapes)

    def check(s: Sim) -> None:
        assert spread(s, list(shapes)) <= bound

    sim.run_until(60.0, check)
    assert sim.raw["b"] / sim.raw["a"] == pytest.approx(2.0, rel=0.1)
    assert sim.raw["a"] / sim.raw["c"] == pytest.approx(2.0, rel=0.1)


# --- lift on activation --------------------------------------------------------------


@pytest.mark.parametrize("served_before", [False, True])
def test_idle_tenant_bursting_gets_no_banked_credit(served_before: bool) -> None:
    clock = Clock()
    q = make_queue(clock)
    sim = Sim(clock, q, {}, depth=5)
    if served_before:  # served once long ago, then idle: its low counter must not count
        sim.join("c", SMALL, count=1)
    sim.join("a", SMALL)
    sim.join("b", LARGE)
    while clock.now < 60.0:
        if (tenant := sim.step(refill=False)) != "c":
            sim.push(tenant)
    assert q.depth("c") == 0
    before = dict(sim.served)
    low = min(q.counters["a"], q.counters["b"])

    sim.join("c", SMALL, count=400)  # a burst, far more than 30 s of service
    assert q.counters["c"] == low  # lifted to the smallest backlogged counter
    u = raw_cost(LARGE)

    def check(s: Sim) -> None:
        since = {t: s.served.get(t, 0.0) - before.get(t, 0.0) for t in ("a", "b", "c")}
        # Initial spread (<= U) plus the running VTC spread (<= U).
        assert since["c"] <= min(since["a"], since["b"]) + 2 * u, (s.clock.now, since)

    sim.run_until(90.0, check)
    since_c = sim.served["c"] - before.get("c", 0.0)
    assert since_c == pytest.approx(30.0 * RATE / 3, abs=2 * u)  # its share, not all of it
    assert q.depth("c") > 0  # still backlogged: the burst did not get everything


def test_new_tenant_when_queue_is_empty_is_lifted_to_the_last_served() -> None:
    clock = Clock()
    q = make_queue(clock)
    for _ in range(10):
        q.push(item("a"))
    while q.pick(always) is not None:
        pass
    assert q.counters["a"] == 10 * raw_cost(SMALL)
    q.push(item("b"))
    assert q.counters["b"] == q.counters["a"]
    for _ in range(9):
        q.push(item("b"))
        q.push(item("a"))
    order = [picked.tenant for picked in iter(lambda: q.pick(always), None)]
    for n in range(1, len(order) + 1):  # neither runs ahead by more than one request
        assert abs(order[:n].count("a") - order[:n].count("b")) <= 1


def test_lift_raises_a_low_counter_and_keeps_a_high_one() -> None:
    clock = Clock()
    q = make_queue(clock)
    q.push(item("a", LARGE))
    for _ in range(3):
        q.push(item("b"))
    picked = q.pick(always)
    assert picked is not None
    assert picked.tenant == "a"  # tie at 0, a came first
    assert q.depth("a") == 0
    q.push(item("a"))  # backlogged again; its 2,000 is above b's 0 and is kept
    assert q.counters["a"] == raw_cost(LARGE)
    for _ in range(3):
        picked = q.pick(always)
        assert picked is not None
        assert picked.tenant == "b"
    assert q.counters["b"] == 3 * raw_cost(SMALL)
    q.push(item("c"))  # new: lifted to the smallest backlogged counter, a's
    assert q.counters["c"] == raw_cost(LARGE)


# --- priorities and aging ------------------------------------------------------------


def test_higher_priority_goes_first_regardless_of_counters() -> None:
    clock = Clock()
    q = make_queue(clock)
    for _ in range(3):  # waiting, but not runnable while b is served
        q.push(item("a", priority=2, partition=9))
    for _ in range(20):
        q.push(item("b"))
    for _ in range(20):
        q.pick(lambda i: i.partition != 9)
    for _ in range(3):
        q.push(item("b", priority=7))
    assert q.counters["b"] == 20 * raw_cost(SMALL)
    assert q.counters["a"] == 0.0
    order = [picked.tenant for picked in iter(lambda: q.pick(always), None)]
    assert order == ["b", "b", "b", "a", "a", "a"]


def test_aging_serves_low_priority_eventually() -> None:
    clock = Clock()
    aging = 10.0
    q = make_queue(clock, aging=aging)
    sim = Sim(clock, q, {}, depth=3, priority={"h": 5, "low": 0})
    sim.join("h", SMALL)
    sim.join("low", SMALL, count=1)
    sim.run_until(120.0)  # low's next request is pushed when the previous one is served
    served_low = [t for t, tenant in sim.log if tenant == "low"]
    # Five classes behind: served once it has aged to priority 5, and promptly then.
    assert len(served_low) == 2
    slack = raw_cost(SMALL) / RATE + 1e-6
    assert 5 * aging <= served_low[0] <= 5 * aging + slack
    # The next one is pushed after the first is served (0.1 s) and waits 50 s again.
    assert 5 * aging <= served_low[1] - served_low[0] <= 5 * aging + 2 * slack
    assert sum(1 for _, tenant in sim.log if tenant == "h") > 500


def test_aging_does_not_let_a_flood_outrank_a_same_priority_tenant() -> None:
    """A tenant with an old backlog must not get ahead of a same-priority newcomer
    just because its requests have waited longer: that would make the queue FIFO."""
    clock = Clock()
    q = make_queue(clock, aging=10.0)
    sim = Sim(clock, q, {}, depth=3)
    sim.join("flood", SMALL, count=5_000)  # 500 s of work, all enqueued at t = 0
    while clock.now < 30.0:
        sim.step(refill=False)
    before = dict(sim.served)
    sim.join("b", LARGE)
    u = raw_cost(LARGE)

    def check(s: Sim) -> None:
        since_b = s.served.get("b", 0.0)
        since_flood = s.served["flood"] - before["flood"]
        assert abs(since_flood - since_b) <= 2 * u, (s.clock.now, since_flood, since_b)

    while clock.now < 90.0:
        tenant = sim.step(refill=False)
        if tenant == "b":
            sim.push("b")
        check(sim)
    assert sim.served["b"] == pytest.approx(30.0 * RATE, abs=2 * u)


def test_aging_lifts_low_priority_to_the_top_class_but_not_past_it() -> None:
    clock = Clock()
    q = make_queue(clock, aging=10.0)
    q.push(item("idle", partition=9))  # backlogged but never runnable: keeps the lift at 0
    for _ in range(6):
        q.push(item("low", priority=0))
    for _ in range(5):
        picked = q.pick(lambda i: i.partition != 9)
        assert picked is not None
        assert picked.tenant == "low"
    clock.now = 500.0  # low's last request has waited 50 aging periods
    q.push(item("high", priority=5, now=500.0))
    assert q.counters["high"] < q.counters["low"]

    def runnable(i: Item[None]) -> bool:
        return i.partition != 9

    picked = q.pick(runnable)
    assert picked is not None
    assert picked.tenant == "high"  # both in class 5: the smaller counter goes first
    picked = q.pick(runnable)
    assert picked is not None
    assert picked.tenant == "low"


def test_a_clock_stepping_back_does_not_break_pick() -> None:
    clock = Clock(100.0)
    q = make_queue(clock)
    q.push(item("a", priority=3, now=100.0))
    q.push(item("b", priority=1, now=100.0))
    clock.now = 50.0
    picked = q.pick(always)
    assert picked is not None
    assert picked.tenant == "a"


# --- locality bonus ------------------------------------------------------------------


def test_warm_request_goes_ahead_only_within_the_bound() -> None:
    clock = Clock()
    q = make_queue(clock, locality_bound=1_000.0)
    for _ in range(30):
        q.push(item("a"))  # 100 each, warm
        q.push(item("b"))  # 100 each, cold
    order = [
        picked.tenant for picked in iter(lambda: q.pick(always, lambda i: i.tenant == "a"), None)
    ]
    # a runs ahead while its counter is within 1,000 of b's: 11 picks (0..1,000).
    assert order[:12] == ["a"] * 11 + ["b"]
    lead = 0.0
    for n in range(1, len(order) + 1):
        head = order[:n]
        lead = max(lead, (head.count("a") - head.count("b")) * raw_cost(SMALL))
    assert lead == 1_000.0 + raw_cost(SMALL)


def test_without_warm_requests_service_alternates() -> None:
    clock = Clock()
    q = make_queue(clock, locality_bound=1_000.0)
    for _ in range(10):
        q.push(item("a"))
        q.push(item("b"))
    order = [picked.tenant for picked in iter(lambda: q.pick(always), None)]
    assert order == ["a", "b"] * 10


def test_warm_request_past_the_bound_waits_for_the_fair_pick() -> None:
    clock = Clock()
    q = make_queue(clock, locality_bound=500.0)
    for _ in range(6):
        q.push(item("a"))
    for _ in range(6):  # a alone: counter 600
        q.pick(always)
    q.push(item("a"))
    q.push(item("b"))  # lifted to 600 as well
    q.counters["a"] = q.counters["b"] + 501.0
    picked = q.pick(always, warm=lambda i: i.tenant == "a")
    assert picked is not None
    assert picked.tenant == "b"
    q.push(item("b"))
    q.counters["a"] = q.counters["b"] + 500.0
    picked = q.pick(always, warm=lambda i: i.tenant == "a")
    assert picked is not None
    assert picked.tenant == "a"


def test_locality_never_jumps_a_priority_class() -> None:
    clock = Clock()
    q = make_queue(clock, locality_bound=1e12)
    q.push(item("a", priority=0))
    q.push(item("b", priority=1))
    picked = q.pick(always, warm=lambda i: i.tenant == "a")
    assert picked is not None
    assert picked.tenant == "b"


# --- runnable items, cancel, settle --------------------------------------------------


def test_unrunnable_head_skips_to_a_runnable_item_deeper_in_the_queue() -> None:
    clock = Clock()
    q = make_queue(clock)
    a1 = item("a", partition=0)
    a2 = item("a", partition=1)
    a3 = item("a", partition=1)
    for it in (a1, a2, a3):
        q.push(it)

    def runnable(i: Item[None]) -> bool:
        return i.partition != 0

    assert q.pick(runnable) is a2
    assert q.pick(runnable) is a3
    assert q.pick(runnable) is None
    assert len(q) == 1
    assert q.depth("a") == 1
    assert q.pick(always) is a1
    assert len(q) == 0


def test_unrunnable_heads_across_tenants() -> None:
    clock = Clock()
    q = make_queue(clock)
    q.push(item("a", partition=0))
    q.push(item("a", partition=1))
    q.push(item("b", partition=0))
    picked = q.pick(lambda i: i.partition == 1)
    assert picked is not None
    assert (picked.tenant, picked.partition) == ("a", 1)
    assert q.pick(lambda i: i.partition == 1) is None
    assert len(q) == 2


def test_scan_is_bounded() -> None:
    clock = Clock()
    q = make_queue(clock)
    for _ in range(SCAN_DEPTH):
        q.push(item("a", partition=0))
    deep = item("a", partition=1)
    q.push(deep)
    assert q.pick(lambda i: i.partition == 1) is None
    q.remove(q.items()[0].request_id)
    assert q.pick(lambda i: i.partition == 1) is deep


def test_remove_cancels_a_queued_request() -> None:
    clock = Clock()
    q = make_queue(clock)
    a1, a2, b1 = item("a"), item("a"), item("b")
    for it in (a1, a2, b1):
        q.push(it)
    assert q.remove(a1.request_id) is a1
    assert q.remove(a1.request_id) is None
    assert q.remove("never-queued") is None
    assert len(q) == 2
    assert q.depth("a") == 1
    assert [i.request_id for i in q.items()] == [a2.request_id, b1.request_id]
    assert q.remove(a2.request_id) is a2
    assert q.tenants() == ["b"]
    picked = [p.request_id for p in iter(lambda: q.pick(always), None)]
    assert picked == [b1.request_id]
    assert q.counters.get("a", 0.0) == 0.0  # a cancelled request costs nothing


def test_get_finds_a_queued_request_without_removing_it() -> None:
    q = make_queue(Clock())
    a1, b1 = item("a"), item("b")
    q.push(a1)
    q.push(b1)
    assert q.get(a1.request_id) is a1
    assert q.get("never-queued") is None
    assert len(q) == 2 and q.depth("a") == 1  # left in place
    assert q.pick(lambda i: i.tenant == "a") is a1
    assert q.get(a1.request_id) is None  # picked: no longer queued
    q.requeue(a1)
    assert q.get(a1.request_id) is a1
    q.remove(b1.request_id)
    assert q.get(b1.request_id) is None


def test_settle_charges_the_real_output() -> None:
    clock = Clock()
    q = make_queue(clock, weights={"a": 2.0})
    q.push(item("a", (100, 1_000)))
    q.pick(always)
    assert q.counters["a"] == (100 + 2 * 1_000) / 2
    q.settle("a", reserved_output=1_000, actual_output=10)
    assert q.counters["a"] == (100 + 2 * 10) / 2
    q.settle("nobody", 10, 0)
    assert "nobody" not in q.counters
