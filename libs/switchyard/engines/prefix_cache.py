"""The simulator's KV block pool with prefix caching, after vLLM's scheme.

`SimEngine` models a paged KV cache: a pool of `num_blocks` fixed-size blocks
(16 tokens by default). A prompt's *full* blocks are identified by chained
hashes (`block_hashes`: each block's hash covers its parent's, so a hit on
block k implies hits on blocks 0..k-1), and the cache salt and LoRA adapter
enter the first hash so tenants and adapters never share a block.

`BlockCache` does the bookkeeping: cached blocks carry a reference count of the
running sequences that hold them; a block nobody holds stays cached but
evictable, in LRU order, until a new allocation needs its room. Blocks a
sequence holds but has not computed yet (or that are not full prompt blocks)
are "private": they count against capacity but are never shared.

Each cached block also names its owner, the session of the sequence that last held
it, so an eviction can tell whether it took a block from a session the engine still
counts active (`active`, the engine's rule: `SimEngine`); `evicted_active` counts those.

Kept apart from the engine so the cache can be read and tested on its own: it
knows blocks, hashes and owners' names, not requests, time or tokens' meaning.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class BlockCache:
    """A block pool of `num_blocks`: full prompt blocks keyed by chained hashes,
    evictable (unreferenced) blocks in LRU order."""

    def __init__(self, num_blocks: int, active: Callable[[str], bool] | None = None) -> None:
        self.num_blocks = num_blocks
        self._ref: dict[bytes, int] = {}  # cached block hash -> sequences holding it
        self._lru: OrderedDict[bytes, None] = OrderedDict()  # ref 0 blocks, oldest first
        self._owner: dict[bytes, str] = {}  # cached block hash -> the session that last held it
        self._active = active or (lambda _: False)
        self.private = 0  # unhashed blocks held by running sequences
        self.evicted = 0
        self.evicted_active = 0  # of `evicted`, blocks whose owner was active then

    @property
    def used(self) -> int:
        """Blocks pinned by running sequences."""
        return len(self._ref) - len(self._lru) + self.private

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks are cached (the longest chain present)."""
        n = 0
        for h in hashes:
            if h not in self._ref:
                break
            n += 1
        return n

    def can_acquire(self, hits: Sequence[bytes], new_blocks: int) -> bool:
        revived = sum(1 for h in hits if h in self._lru)
        return self.used + revived + new_blocks <= self.num_blocks

    def acquire(self, hits: Sequence[bytes], new_blocks: int, owner: str | None = None) -> None:
        for h in hits:
            self._pin(h, owner)
        self.private += new_blocks
        self._evict()

    def commit(self, hashes: Iterable[bytes], owner: str | None = None) -> int:
        """Turn private blocks whose prefill finished into cached, pinned blocks."""
        n = 0
        for h in hashes:
            if h in self._ref:
                self._pin(h, owner)  # computed concurrently by another sequence: share it
            else:
                self._ref[h] = 1
                if owner is not None:
                    self._owner[h] = owner
            n += 1
        self.private -= n
        return n

    def release(self, pinned: Sequence[bytes], private: int) -> None:
        # Reversed, like vLLM: a prompt's tail becomes older than its head in
        # the LRU, so shared prefixes are the last to go.
        for h in reversed(pinned):
            left = self._ref[h] - 1
            self._ref[h] = left
            if left == 0:
                self._lru[h] = None
        self.private -= private

    def _pin(self, h: bytes, owner: str | None) -> None:
        if self._ref[h] == 0:
            del self._lru[h]
        self._ref[h] += 1
        if owner is not None:
            self._owner[h] = owner

    def _evict(self) -> None:
        while len(self._ref) + self.private > self.num_blocks and self._lru:
            h, _ = self._lru.popitem(last=False)
            del self._ref[h]
            self.evicted += 1
            owner = self._owner.pop(h, None)
            if owner is not None and self._active(owner):
                self.evicted_active += 1


def block_hashes(
    tokens: Sequence[str], block_size: int, *, salt: str | None, lora: str | None
) -> list[bytes]:
    """Chained hashes of the full blocks: hash(parent, block tokens).

    The salt and the LoRA adapter enter the first block (as vLLM's extra keys
    do), so requests with different salts or adapters never share a block.
    """
    out: list[bytes] = []
    parent = hashlib.blake2b(
        f"sim\x1e{salt or ''}\x1e{lora or ''}".encode(), digest_size=16
    ).digest()
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = "\x1f".join(tokens[start : start + block_size]).encode()
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        out.append(parent)
    return out
