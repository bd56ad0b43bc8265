"""The pipeline's in-process caches, every key starting with the tenant.

- exact: (tenant, normalised question, knowledge version) -> the answer; a
  knowledge edit changes the version, so no answer outlives the knowledge it
  was built from;
- result: (tenant, canonical SQL) -> the executor's reply, for a short time, so
  a burst of the same question costs the database once.

The semantic cache lives in the knowledge index (items of kind "answer"), where
every read is tenant-filtered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class TtlCache(Generic[V]):
    """A small LRU with a time-to-live; keys are tuples that start with the tenant."""

    def __init__(self, *, ttl: float, capacity: int = 4096) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, ...], tuple[float, V]] = OrderedDict()

    def get(self, key: tuple[str, ...], now: float | None = None) -> V | None:
        now = time.monotonic() if now is None else now
        item = self._items.get(key)
        if item is None or item[0] <= now:
            if item is not None:
                del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: tuple[str, ...], value: V, now: float | None = None) -> None:
        if self.ttl <= 0:
            return
        now = time.monotonic() if now is None else now
        self._items[key] = (now + self.ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
