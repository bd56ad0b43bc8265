"""Units of capacity inputs: bytes (GB or GiB) and parameter counts (a count or billions).

Capacity numbers are only comparable when their unit is explicit. GPU vendors and
the seed documents label memory in GB (10^9 bytes) while KV-cache figures are
usually quoted in MiB/GiB (2^20 / 2^30 bytes); the two differ by 7.4 % at the giga
scale, enough to move a floor() by one request. Everything inside
`switchyard.capacity` is computed in bytes; a unit only appears at the edges.

Parameter counts are written both ways ("70e9", "70B"); `parse_params` reads
either, and a bare small number ("70", "7.6") as billions.
"""

from __future__ import annotations

import math
from enum import StrEnum

from switchyard.capacity.errors import CapacityInputError

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


# A model has MIN_PARAMS..MAX_PARAMS parameters (10^13 = 10,000 B: well past any model
# one replica serves). A bare number below BILLIONS_BELOW is billions ("70", "7.61"), one
# from MIN_PARAMS up is a count ("70e9", "135000000"); in between neither reading is a
# model (10^13+ parameters, or a 10^4..10^6-parameter toy), so it is refused as ambiguous.
MIN_PARAMS = 1e6
MAX_PARAMS = 1e13
BILLIONS_BELOW = 10_000
_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_FORMS = "write e.g. 70e9, 70B, 7.6b or 135M (a bare number below 10000 is billions)"


def parse_params(text: str) -> float:
    """A parameter count in billions, from "70e9", "70B", "7.6b", "135M" or a bare "70".

    Raises `CapacityInputError` for anything that is not one positive, plausible count.
    """
    s = text.strip().replace("_", "")
    scale = _SUFFIXES.get(s[-1:].lower())
    try:
        value = float(s[:-1] if scale else s)
    except ValueError:
        raise CapacityInputError(f"{text!r} is not a parameter count: {_FORMS}") from None
    if not math.isfinite(value) or value <= 0:
        raise CapacityInputError(f"a parameter count must be a positive number, got {text!r}")
    if scale is not None:
        count = value * scale
    elif value < BILLIONS_BELOW:
        count = value * 1e9
    elif value >= MIN_PARAMS:
        count = value
    else:
        raise CapacityInputError(
            f"{text!r} is ambiguous: {value:g} billion parameters is no model, nor is "
            f"{value:g} parameters; {_FORMS}"
        )
    if not MIN_PARAMS <= count <= MAX_PARAMS:
        raise CapacityInputError(
            f"{text!r} is {count:.3g} parameters; a model has between {MIN_PARAMS:.0e} and "
            f"{MAX_PARAMS:.0e}"
        )
    return count / 1e9
