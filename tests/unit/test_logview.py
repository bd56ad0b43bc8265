"""`sy up`'s view of its children's logs: JSON as logged, or rendered for a person."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from switchyard.cli.logview import LogView, parse, pretty, ranges, render

RECORD = {
    "logger_name": "services.worker.ownership", "partitions": [0, 1, 2, 3, 7], "released": [],
    "took": [7], "note": "two words", "tenant": None, "event": "worker.owns",
    "service": "worker-vm-1", "level": "warning", "timestamp": "2026-12-01T09:43:50.393905Z",
}  # fmt: skip


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is shown; pin it to UTC so the expected text does not depend on the box."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def captured() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=400, color_system=None, soft_wrap=True), out


def move(partition: int, reason: str = "initial") -> str:
    return json.dumps({"event": "router.move", "pool": "llm", "partition": partition,
                       "reason": reason, "level": "info"})  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "terminal", "expected"),
    [("auto", True, True), ("auto", False, False), ("json", True, False), ("pretty", False, True)],
)
def test_json_unless_a_terminal_or_asked(fmt: Any, terminal: bool, expected: bool) -> None:
    assert pretty(fmt, terminal) is expected


def test_only_structlog_records_are_parsed() -> None:
    assert parse(json.dumps(RECORD)) == RECORD
    assert parse("INFO:     Uvicorn running on http://127.0.0.1:8080") is None
    assert parse('{"no": "event"}') is None
    assert parse("{not json") is None


def test_integer_lists_read_as_ranges() -> None:
    assert ranges([7, 0, 1, 2, 3]) == "0-3,7"
    assert ranges([5]) == "5"
    assert ranges([]) == "-"


def test_a_record_reads_as_time_level_event_and_its_fields(utc: None) -> None:
    text = render(RECORD)
    assert text.plain == (
        '09:43:50.393 warning worker.owns partitions=0-3,7 released=- took=7 note="two words"'
    )
    level = next(
        span for span in text.spans if text.plain[span.start : span.end].strip() == "warning"
    )
    assert "yellow" in str(level.style)  # coloured by its level


def test_a_traceback_follows_its_record() -> None:
    text = render({"event": "worker.failed", "level": "error", "exception": "Traceback\n  boom\n"})
    assert text.plain.splitlines() == ["error   worker.failed", "Traceback", "  boom"]


def test_json_lines_are_printed_unchanged_behind_the_service_name() -> None:
    console, out = captured()
    view = LogView(console, ["router", "worker-agent"], pretty=False)
    view.line("router", move(0))
    view.line("router", "INFO: plain text")
    assert out.getvalue().splitlines() == [
        f"router       │ {move(0)}",
        "router       │ INFO: plain text",
    ]
    assert view.started() == ""  # nothing held back in JSON


def test_pretty_holds_start_up_partition_moves_until_ready(utc: None) -> None:
    console, out = captured()
    view = LogView(console, ["router", "worker"], pretty=True)
    for p in range(64):
        view.line("router", move(p))
    view.line("router", move(3, reason="spill"))
    view.line("worker", json.dumps({"event": "worker.owns", "partitions": list(range(64))}))
    view.line("worker", json.dumps({"event": "worker.ready", "level": "info", "pool": "llm"}))
    assert out.getvalue().splitlines() == ["worker │ info    worker.ready pool=llm"]
    assert view.started() == (
        "64 initial partition moves, 1 spill partition moves, 1 worker ownership updates"
    )
    view.line("router", move(5, reason="dead"))  # after start-up, every move is news
    assert out.getvalue().splitlines()[-1] == (
        "router │ info    router.move pool=llm partition=5 reason=dead"
    )
