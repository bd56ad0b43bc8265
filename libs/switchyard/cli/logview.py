"""What `sy up` prints of its children's output: JSON as logged, or lines for a person.

Services log one JSON object per line (structlog, `switchyard.logging`), which is what
log shippers and `jq` want, and what `sy up` prints when its stdout is a file or a pipe,
or with `--log-format json`. On a terminal it renders each record as

    09:43:50.421 info    worker.ready engine=sim pool=llm mode=kv

coloured by level, behind the service's name; a line that is not such a record
(uvicorn's own, a traceback) passes through as it is.

Start-up is summarised when rendering: until the fleet is ready, the router's moves of
partitions (the initial assignment and, as more workers join, the spill onto them) and
the workers' growing lists of owned partitions, one line per partition on a pool of 64,
are counted instead of printed; `sy up` then prints one line saying how many partitions
of each pool its workers serve, and how many such lines it held back.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from rich.console import Console
from rich.text import Text

LogFormat = Literal["auto", "json", "pretty"]

COLORS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_green")
LEVELS = {"debug": "dim", "info": "green", "warning": "yellow", "error": "bold red",
          "critical": "bold white on red"}  # fmt: skip
# Shown elsewhere on the line (prefix, time, level, event) or noise for a person: the
# event names already say which part of the code logged them.
HIDDEN = frozenset({"event", "level", "timestamp", "service", "logger_name", "exception"})


def pretty(fmt: LogFormat, terminal: bool) -> bool:
    """Whether to render for a person: asked to, or `auto` on a terminal."""
    return fmt == "pretty" or (fmt == "auto" and terminal)


def parse(line: str) -> dict[str, Any] | None:
    """The structlog record on `line`, or None if it is not one."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "event" in record else None


def startup_move(record: dict[str, Any]) -> str | None:
    """What a record that narrates start-up partition by partition counts as, or None.
    Every move of the router counts until the fleet is ready: as workers join, the
    first one's partitions spill onto the others, one line each."""
    event = record.get("event")
    if event == "router.move":
        return f"{record.get('reason', 'other')} partition moves"
    return "worker ownership updates" if event == "worker.owns" else None


def ranges(numbers: Sequence[int]) -> str:
    """`[0, 1, 2, 3, 7]` -> `0-3,7`: a worker's 64 partitions in a few characters."""
    if not numbers:
        return "-"
    parts = []
    ordered = sorted(numbers)
    for _, run in itertools.groupby(enumerate(ordered), lambda iv: iv[1] - iv[0]):
        values = [v for _, v in run]
        parts.append(str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}")
    return ",".join(parts)


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return ranges(value)
    if isinstance(value, str):
        return (
            value
            if value and not any(c.isspace() or c == "=" for c in value)
            else json.dumps(value)
        )
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def clock(timestamp: Any) -> str:
    """An ISO timestamp (UTC) as this machine's local time of day, to the millisecond."""
    try:
        moment = datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    except ValueError:
        return str(timestamp)
    return moment.astimezone().strftime("%H:%M:%S.%f")[:-3]


def render(record: dict[str, Any]) -> Text:
    """`time level event key=value ...`, coloured by level; a traceback below it."""
    level = str(record.get("level", "info"))
    style = LEVELS.get(level, "")
    text = Text()
    if "timestamp" in record:
        text.append(f"{clock(record['timestamp'])} ", "dim")
    text.append(f"{level:<7} ", style)
    text.append(str(record.get("event", "")), f"bold {style}" if level != "info" else "bold")
    for key, value in record.items():
        if key in HIDDEN or value is None:
            continue
        text.append(f" {key}=", "dim")
        text.append(value_text(value))
    if record.get("exception"):
        text.append("\n" + str(record["exception"]).rstrip(), "red")
    return text


class LogView:
    """The `on_output` of `sy up`'s children: each line behind its service's name, as
    JSON or rendered (`pretty`), start-up partition moves held until `started()`.

    Called from the launcher's reader threads, one per child: the console prints whole
    lines under its own lock, and the count of held records is guarded here.
    """

    def __init__(self, console: Console, names: Iterable[str], *, pretty: bool) -> None:
        names = list(names)
        self.console = console
        self.pretty = pretty
        self.width = max((len(n) for n in names), default=0)
        self.colors = {n: c for n, c in zip(names, itertools.cycle(COLORS), strict=False)}
        self._lock = threading.Lock()
        self._starting = True
        self._held: Counter[str] = Counter()

    def color(self, name: str) -> str:
        return self.colors.get(name, "white")

    def line(self, name: str, line: str) -> None:
        prefix = Text(f"{name:<{self.width}} │ ", self.color(name))
        record = parse(line) if self.pretty else None
        if record is None:
            self.console.print(prefix + Text(line))
            return
        kind = startup_move(record)
        if kind is not None:
            with self._lock:
                if self._starting:
                    self._held[kind] += 1
                    return
        self.console.print(prefix + render(record))

    def started(self) -> str:
        """Print every record from now on; what was held meanwhile, in words ("" if none)."""
        with self._lock:
            self._starting = False
            return ", ".join(f"{n} {kind}" for kind, n in sorted(self._held.items()))
