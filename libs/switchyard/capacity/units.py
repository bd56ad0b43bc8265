"""Byte units. Capacity numbers are only comparable when their unit is explicit.

GPU vendors and the seed documents label memory in GB (10^9 bytes) while KV-cache
figures are usually quoted in MiB/GiB (2^20 / 2^30 bytes); the two differ by 7.4 %
at the giga scale, enough to move a floor() by one request. Everything inside
`switchyard.capacity` is computed in bytes; a unit only appears at the edges.
"""

from __future__ import annotations

from enum import StrEnum

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
KiB = 2**10
MiB = 2**20
GiB = 2**30

UNITS_NOTE = "GB = 10^9 bytes, GiB = 2^30 bytes, MiB = 2^20 bytes; bandwidth in GB/s (10^9 B/s)"


class MemUnit(StrEnum):
    """How to read a memory figure given as a bare number ("80", "14", "4").

    `GB` (the default) reads it as 10^9 bytes, as vendors label cards and as the
    [S2] §3.3 code computes. `GiB` reads it as 2^30 bytes, which is how the
    [S2] §3.2 table arrives at its concurrency column.
    """

    GB = "GB"
    GiB = "GiB"

    @property
    def bytes(self) -> int:
        return GB if self is MemUnit.GB else GiB


def to_gb(n_bytes: float) -> float:
    return n_bytes / GB


def to_gib(n_bytes: float) -> float:
    return n_bytes / GiB


def to_mib(n_bytes: float) -> float:
    return n_bytes / MiB
