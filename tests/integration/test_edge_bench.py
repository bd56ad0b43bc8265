"""`sy bench edge --json` end to end on the session's NATS, with a small request count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

KEYS = {
    "requests_per_path", "concurrency", "max_tokens", "direct_p50_ms", "direct_p99_ms",
    "edge_p50_ms", "edge_p99_ms", "added_p50_ms", "added_p99_ms", "direct_mean_ms",
    "edge_mean_ms", "wall_s", "errors",
}  # fmt: skip


def test_sy_bench_edge_json(nats_url: str) -> None:
    sy = Path(sys.executable).parent / "sy"
    out = subprocess.run(
        [str(sy), "bench", "edge", "--json", "--requests", "24", "--concurrency", "4",
         "--nats", nats_url],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)  # one JSON object and nothing else on stdout
    assert set(result) == KEYS
    assert result["errors"] == 0 and result["requests_per_path"] == 24
    assert 0 < result["direct_p50_ms"] <= result["direct_p99_ms"]
    assert 0 < result["edge_p50_ms"] <= result["edge_p99_ms"]
    added = result["edge_p50_ms"] - result["direct_p50_ms"]
    assert abs(result["added_p50_ms"] - added) <= 0.011
