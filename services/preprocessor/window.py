"""The `window` layout's memory: a session's earlier frames, where any replica can read them.

A window prompt lays out the frames of steps `start`..k (`switchyard.agentprompt`),
but a phone sends only step k's frame (and maybe k-1's), and consecutive steps
of a session may land on different preprocessor replicas (they share one
INGRESS durable). So each step's prepared frame goes to KV `agent_windows`
under `<pool>.<tenant>.<session>.<step>` (`WindowFrame`: the bytes and hash the
prompt carried, the geometry, and the window start that step used), and step
k reads steps `start`..k-1 back by key. A step's entry is written before its
request is published, so the session's next step, which a phone sends after
this one's answer, always finds it. One entry per step, never a whole
window in one value: a step writes one frame, not W, and two replicas never
race on a shared value. This replica also keeps recent entries in memory
(`agent_window_cache_mb`), so a session that comes back here reads nothing.

Where step k's window starts follows from step k-1's entry alone
(`agentprompt.window_start`): the same start while it holds fewer than W
frames, else a compaction at k. Whatever goes wrong restarts the window at k
(the prompt then holds the current frame and every action as text, exactly a
compaction) and never fails the step:

- no entry for k-1: the first step, the TTL ran out (a paused session), a
  replica's write failed, a step was skipped (steps not consecutive) or
  answered before it was laid out (stale, rejected);
- an earlier frame of the window missing, or written by another window or
  another episode under the same session id (`goal_digest`);
- the window's frames would not fit one message (`layout.window_fits` bounds
  the worst case at start-up; real frames are checked here).

The frames of a window that ended are deleted; those of one that broke, or of a
session that stopped, expire with the bucket's TTL (`SY_AGENT_WINDOW_TTL`).
Deleting keeps the bucket near W frames per live session, where keeping
everything for the TTL would hold every frame of the last two minutes.

A step without a session id has no window to continue: each of its steps is a
restart. The actions are always the client's history (agentprompt), so a
restart changes which frames the model sees, never which actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from services.preprocessor.images import PreparedFrame
from services.preprocessor.layout import REQUEST_OVERHEAD_BYTES, step_text_bytes
from services.preprocessor.metrics import WINDOWS
from switchyard.agentprompt import Geometry, window_start
from switchyard.bus.topology import WINDOWS_BUCKET
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.agent import AgentStep
from switchyard.messages.agentwindow import WindowFrame, window_key
from switchyard.messages.inference import Image

log = get_logger(__name__)

# first: a session's step 0; no_session: a step without a session id (no window to keep).
Outcome = Literal["first", "no_session", "continued", "compacted", "restarted", "oversized"]


@dataclass(frozen=True)
class Window:
    """The frames of one step's window prompt, oldest first, the current frame last."""

    start: int
    frames: list[PreparedFrame]
    outcome: Outcome
    # Steps of the window this one replaced: their entries are no longer needed.
    ended: range = field(default_factory=lambda: range(0))


def goal_digest(goal: str) -> str:
    return hashlib.blake2b(goal.encode(), digest_size=8).hexdigest()


def to_entry(step: AgentStep, start: int, frame: PreparedFrame) -> WindowFrame:
    g = frame.geometry
    return WindowFrame(
        step=step.step, start=start, goal_digest=goal_digest(step.goal), at=time.time(),
        image=Image(
            hash=frame.hash, data=frame.data, mime=frame.mime,  # type: ignore[arg-type]
            width=g.width, height=g.height,
        ),
        geometry=g.frame_geometry(),
    )  # fmt: skip


def from_entry(entry: WindowFrame) -> PreparedFrame:
    img = entry.image
    return PreparedFrame(img.hash, img.data, img.mime, Geometry.of(entry.geometry), 0.0, 0.0)


class WindowStore:
    """KV `agent_windows` with a byte-bounded read-through cache of this replica's entries."""

    def __init__(self, js: JetStreamContext, pool: str, cache_bytes: int) -> None:
        self.js = js
        self.pool = pool
        self._kv: KeyValue | None = None
        self._cache: OrderedDict[str, WindowFrame] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._cached = 0

    async def open(self) -> None:
        self._kv = await self.js.key_value(WINDOWS_BUCKET)

    def _key(self, tenant: str, session: str, step: int) -> str:
        return window_key(self.pool, tenant, session, step)

    async def get(self, tenant: str, session: str, step: int) -> WindowFrame | None:
        """Step `step`'s entry, or None if it is gone or unreadable (the window restarts)."""
        key = self._key(tenant, session, step)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        if self._kv is None:
            return None
        try:
            entry = await self._kv.get(key)
        except NotFoundError:
            return None
        except (TimeoutError, NatsError) as exc:
            log.warning("agent.window_read_failed", key=key, error=str(exc))
            return None
        if entry.value is None:
            return None
        try:
            frame = decode(entry.value, WindowFrame)
        except DecodeError as exc:
            log.warning("agent.window_entry_invalid", key=key, error=str(exc))
            return None
        self._remember(key, frame)
        return frame

    async def put(self, tenant: str, session: str, frame: WindowFrame) -> None:
        key = self._key(tenant, session, frame.step)
        self._remember(key, frame)
        if self._kv is None:
            return
        try:
            await self._kv.put(key, encode(frame))
        except (TimeoutError, NatsError) as exc:
            # The next step finds no entry and restarts its window: slower, never wrong.
            log.warning("agent.window_write_failed", key=key, error=str(exc))

    async def forget(self, tenant: str, session: str, steps: range) -> None:
        keys = [self._key(tenant, session, s) for s in steps]
        for key in keys:
            self._drop(key)
        if self._kv is None or not keys:
            return
        kv = self._kv

        async def delete(key: str) -> None:
            with contextlib.suppress(TimeoutError, NatsError):
                await kv.delete(key)  # a failed delete only waits for the TTL

        await asyncio.gather(*(delete(k) for k in keys))

    def _remember(self, key: str, frame: WindowFrame) -> None:
        size = len(frame.image.data)
        if size > self._cache_bytes:
            return
        self._drop(key)
        self._cache[key] = frame
        self._cached += size
        while self._cached > self._cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old.image.data)

    def _drop(self, key: str) -> None:
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached -= len(old.image.data)


async def assemble(
    store: WindowStore, step: AgentStep, current: PreparedFrame, window: int, budget: int
) -> Window:
    """Step `step`'s window: the stored frames of its earlier steps, then `current`.

    `budget` is the most bytes one request may take (the message limit).
    """
    k = step.step
    if step.session is None:
        return Window(k, [current], "no_session")
    if k == 0:
        return Window(k, [current], "first")
    prev = await store.get(step.tenant, step.session, k - 1)
    if (
        prev is None
        or prev.step != k - 1
        or prev.start > k - 1
        or prev.goal_digest != goal_digest(step.goal)
    ):
        return Window(k, [current], "restarted")
    start = window_start(prev.start, k, window)
    ended = range(prev.start, k)
    if start == k:
        return Window(k, [current], "compacted", ended)
    session = step.session
    earlier = await asyncio.gather(
        *(store.get(step.tenant, session, s) for s in range(start, k - 1))
    )
    entries = [*earlier, prev]
    if any(e is None or e.start != start or e.goal_digest != prev.goal_digest for e in entries):
        return Window(k, [current], "restarted", ended)
    frames = [from_entry(e) for e in entries if e is not None] + [current]
    need = sum(len(f.data) for f in frames) + step_text_bytes(step) + REQUEST_OVERHEAD_BYTES
    if need > budget:
        return Window(k, [current], "oversized", ended)
    return Window(start, frames, "continued")


async def remember(store: WindowStore, step: AgentStep, win: Window) -> None:
    """Keep the current frame for the next step; drop the window `win` ended."""
    WINDOWS.labels(win.outcome).inc()
    if step.session is None:
        return
    await asyncio.gather(
        store.put(step.tenant, step.session, to_entry(step, win.start, win.frames[-1])),
        store.forget(step.tenant, step.session, win.ended),
    )
