"""Sortable unique ids (ULID layout: 48-bit milliseconds + 80 random bits, Crockford base32).

Sortable so JetStream replays and logs read in creation order; random enough that
two edges never collide; safe as a NATS subject token (no dots or wildcards).
"""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(now: float | None = None) -> str:
    ms = int((time.time() if now is None else now) * 1000)
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def id_time(request_id: str) -> float:
    """The creation time (seconds) encoded in an id made by `new_id`."""
    value = 0
    for ch in request_id:
        value = value * 32 + _ALPHABET.index(ch)
    return (value >> 80) / 1000
