"""What every `sy bench` report shares: one percentile, so all tables agree, and the JSON form."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, `q` in 0..1 (0.99 = p99); 0 when there are no values.

    Nearest rank reports a value that was really measured, never an interpolation.
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class Report:
    """A benchmark's result (a dataclass): `as_dict()` is what its `--json` prints."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(cast("DataclassInstance", self))
