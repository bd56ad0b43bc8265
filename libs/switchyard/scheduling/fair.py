"""Fair queueing across tenants by virtual token counters (VTC).

Each tenant has a counter of the weighted tokens it has been served
(`w_in` x prompt + `w_out` x output, divided by its weight). The next request
comes from the backlogged tenant with the smallest counter, so under contention
tenants receive service in proportion to their weights, measured in tokens.
A tenant that becomes backlogged has its counter lifted to the smallest
backlogged counter, so idling never banks credit for a later burst.

Within that order:
- priority classes go first, and a waiting request gains one class per
  `aging` seconds, so low priority never starves. Aging lifts a request at most
  to the highest priority waiting: it lets low priority catch up, never
  overtake. Uncapped, the tenant with the oldest backlog (a flood) would
  outrank a same-priority tenant whose requests are fresh, and service would
  become FIFO by age instead of fair;
- a request whose partition is warm (its worker holds the prefix) may go ahead
  of the fair pick if its tenant is within `locality_bound` weighted tokens of
  it — bounded unfairness bought for cache hits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

SCAN_DEPTH = 64  # items looked at per tenant when its head cannot run yet


@dataclass
class Item(Generic[T]):
    request_id: str
    tenant: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    partition: int
    enqueued_at: float
    payload: T


@dataclass
class FairQueue(Generic[T]):
    clock: Callable[[], float]
    weight: Callable[[str], float] = lambda _tenant: 1.0
    w_in: float = 1.0
    w_out: float = 2.0
    aging: float = 10.0
    locality_bound: float = 4096.0
    counters: dict[str, float] = field(default_factory=dict)
    _queues: dict[str, deque[Item[T]]] = field(default_factory=dict)
    _index: dict[str, Item[T]] = field(default_factory=dict)
    _floor: float = 0.0  # counter of the last tenant served: lift target when nobody waits

    def __len__(self) -> int:
        return len(self._index)

    def depth(self, tenant: str) -> int:
        return len(self._queues.get(tenant, ()))

    def tenants(self) -> list[str]:
        return [t for t, q in self._queues.items() if q]

    def cost(self, tenant: str, prompt_tokens: int, output_tokens: int) -> float:
        return (self.w_in * prompt_tokens + self.w_out * output_tokens) / self.weight(tenant)

    def push(self, item: Item[T]) -> None:
        queue = self._queues.setdefault(item.tenant, deque())
        if not queue:
            backlogged = [self.counters[t] for t in self.tenants() if t in self.counters]
            lift = min(backlogged) if backlogged else self._floor
            self.counters[item.tenant] = max(self.counters.get(item.tenant, 0.0), lift)
        queue.append(item)
        self._index[item.request_id] = item

    def get(self, request_id: str) -> Item[T] | None:
        """The queued item of `request_id`, left in place; None if it is not queued."""
        return self._index.get(request_id)

    def remove(self, request_id: str) -> Item[T] | None:
        item = self._index.pop(request_id, None)
        if item is not None:
            self._queues[item.tenant].remove(item)
        return item

    def items(self) -> list[Item[T]]:
        return list(self._index.values())

    def _class(self, item: Item[T], now: float, ceiling: int) -> int:
        waited = max(0.0, now - item.enqueued_at)  # a clock stepping back must not demote
        return min(item.priority + int(waited / self.aging), ceiling)

    def pick(
        self, can_run: Callable[[Item[T]], bool], warm: Callable[[Item[T]], bool] = lambda _: False
    ) -> Item[T] | None:
        """Remove and return the next request to dispatch, or None if none can run."""
        now = self.clock()
        heads: list[Item[T]] = []
        for queue in self._queues.values():
            for i, item in enumerate(queue):
                if i >= SCAN_DEPTH:
                    break
                if can_run(item):
                    heads.append(item)
                    break
        if not heads:
            return None
        ceiling = max(i.priority for i in heads)
        heads = [i for i in heads if self._class(i, now, ceiling) == ceiling]
        fair = min(heads, key=lambda i: (self.counters[i.tenant], i.enqueued_at))
        bound = self.counters[fair.tenant] + self.locality_bound
        local = [i for i in heads if warm(i) and self.counters[i.tenant] <= bound]
        chosen = (
            min(local, key=lambda i: (self.counters[i.tenant], i.enqueued_at)) if local else fair
        )
        self.remove(chosen.request_id)
        self.counters[chosen.tenant] += self.cost(
            chosen.tenant, chosen.prompt_tokens, chosen.max_tokens
        )
        self._floor = self.counters[chosen.tenant]
        return chosen

    def requeue(self, item: Item[T]) -> None:
        """Put back a picked item that could not be dispatched, refunding its charge."""
        self.counters[item.tenant] -= self.cost(item.tenant, item.prompt_tokens, item.max_tokens)
        self._queues.setdefault(item.tenant, deque()).appendleft(item)
        self._index[item.request_id] = item

    def settle(self, tenant: str, reserved_output: int, actual_output: int) -> None:
        """Charge the real output instead of the `max_tokens` charged at dispatch."""
        if tenant in self.counters:
            self.counters[tenant] += self.cost(tenant, 0, actual_output - reserved_output)
