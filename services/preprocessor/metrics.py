"""Preprocessor metrics: frame decoding and resizing (updated in the service process, after
the worker pool returns, so the child processes' registries never matter)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from switchyard.metrics import LATENCY_BUCKETS

DECODE_S = Histogram(
    "sy_preprocessor_frame_decode_seconds", "Frame decode time", buckets=LATENCY_BUCKETS
)
RESIZE_S = Histogram(
    "sy_preprocessor_frame_resize_seconds", "Resize, hash and re-encode time",
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
BYTES_IN = Counter("sy_preprocessor_frame_input_bytes_total", "Raw frame bytes decoded")
BYTES_OUT = Counter("sy_preprocessor_frame_output_bytes_total", "Re-encoded frame bytes")
# `code` is an ErrorCode (a fixed set).
REJECTED = Counter("sy_preprocessor_frames_rejected_total", "Frames refused", ["code"])
CACHE_HITS = Counter("sy_preprocessor_frame_cache_hits_total", "Frames served from the cache")
# Agent steps answered `stale` here, before any work on their frames.
STALE = Counter("sy_preprocessor_stale_answers_total", "Agent steps answered stale on arrival")
# |fleet clock - client clock| as estimated per session (clock.py): a phone fleet whose
# clocks drift shows here before its steps start going stale.
CLOCK_OFFSET = Histogram(
    "sy_preprocessor_client_clock_offset_seconds",
    "Absolute estimated client clock offset of each agent step's session",
    buckets=LATENCY_BUCKETS,
)
# How each `window`-layout step's window came about (window.py): `restarted` and
# `oversized` are windows lost (expired, another replica's write failed, steps not
# consecutive) or too big for a message; each costs one step a compaction's prefill.
WINDOWS = Counter(
    "sy_preprocessor_agent_window_decisions_total",
    "Window-layout agent steps, by how their window was built",
    ["outcome"],
)
