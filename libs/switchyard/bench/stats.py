"""Percentiles for benchmark reports: one definition, so every `sy bench` table agrees."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, `q` in 0..1 (0.99 = p99); 0 when there are no values.

    Nearest rank reports a value that was really measured, never an interpolation.
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
