"""Partition keys, byte-identical to the NATS server's `{{partition(P, tokens...)}}` mapping.

nats-server hashes the selected subject tokens concatenated (no separator) with
FNV-1a 32-bit and takes the value modulo P; the router does the same with the
session id (agent) or tenant (SQL), so a server-side mapping and the router agree.
"""

from __future__ import annotations

import functools

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


# A byte at a time in Python: ~1 us per 10 bytes. The router hashes the same few thousand
# sessions and tenants over and over (every request, and its delivery partition).
@functools.lru_cache(maxsize=1 << 16)
def fnv1a_32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h


def partition(key: str, partitions: int) -> int:
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    return fnv1a_32(key.encode()) % partitions
