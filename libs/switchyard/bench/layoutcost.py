"""What each agent prompt layout costs per step, as the sim engine's prefix cache sees it.

An episode's prompts are laid out by `switchyard.agentprompt.build_messages` and
rendered by the sim engine's own `render_prompt` (its pseudo-tokenizer), so the
figures are exact for `--engine sim` and indicative for real tokenizers. A step's
cached tokens are what an unbounded block cache would serve after the episode's
earlier steps: the longest prefix it shares with any of them, in whole KV
blocks, never its last token (vLLM always computes it), as `SimEngine` counts.
The prefill is the rest.

The window is the ideal one: no restarts, so step k's frames start at
k - k % W (`agentprompt.window_start` folded from step 0). The preprocessor
restarts a window it lost, which costs one compaction each time.

`python -m switchyard.bench.layoutcost` prints the table in
`switchyard.agentprompt`'s docstring; `--write` puts it there (after a change
to the layouts or to the sim's pseudo-tokenizer; a unit test compares them).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from switchyard import agentprompt
from switchyard.agentprompt import AgentLayout, build_messages, fit, window_start
from switchyard.engines.base import EngineRequest
from switchyard.engines.prefix_cache import common_prefix
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import render_prompt
from switchyard.messages.agent import AgentStep, Click, RawFrame, Swipe, Wait
from switchyard.messages.inference import Image

# (layout, window) rows of the documented table; W only matters for `window`.
TABLE_ROWS: tuple[tuple[AgentLayout, int], ...] = (
    ("pair", 0), ("single", 0), ("window", 4), ("window", 8),
)  # fmt: skip


def frame_steps(layout: AgentLayout, step: int, window: int, sent: int = 2) -> list[int]:
    """The steps whose frames `layout`'s prompt holds at `step`, oldest first.

    `sent`: frames the client sends (the previous one from step 1 on), which
    `pair` lays out as they come; `window` holds the ideal window's frames.
    """
    if layout == "single":
        return [step]
    if layout == "pair":
        return list(range(max(0, step - sent + 1), step + 1))
    start = 0
    for k in range(1, step + 1):
        start = window_start(start, k, window)
    return list(range(start, step + 1))


def frame_image(seed: str, k: int, size: tuple[int, int]) -> Image:
    """Frame k of an episode: its own hash, no bytes (the sim counts tokens by size)."""
    digest = hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=16).hexdigest()
    return Image(hash=digest, data=b"", mime="image/jpeg", width=size[0], height=size[1])


def sample_actions(n: int, seed: int = 20) -> list[str]:
    """JSON actions as a phone records them (clicks, some swipes and waits), seeded."""
    rnd = random.Random(seed)
    out: list[str] = []
    for _ in range(n):
        r = rnd.random()
        action: Click | Swipe | Wait
        if r < 0.7:
            action = Click(x=rnd.randrange(1260), y=rnd.randrange(700))
        elif r < 0.9:
            action = Swipe(x1=rnd.randrange(1260), y1=600, x2=rnd.randrange(1260), y2=100)
        else:
            action = Wait(ms=rnd.choice((300, 500, 1000)))
        out.append(json.dumps(action.model_dump(), separators=(",", ":")))
    return out


def episode_tokens(
    layout: AgentLayout, window: int, steps: int, width: int = 1280, height: int = 720,
    max_pixels: int = 1280 * 720,
) -> list[list[str]]:  # fmt: skip
    """The sim pseudo-tokens of every step's prompt in one episode."""
    size = fit(width, height, max_pixels)
    actions = sample_actions(steps)
    sim = SimSettings()
    out: list[list[str]] = []
    for k in range(steps):
        frames = [frame_image("episode", s, size) for s in frame_steps(layout, k, window)]
        step = AgentStep(
            tenant="t", session="episode", frame_ts=0.0, step=k, history=actions[:k],
            goal="collect the daily reward (episode e1)", frames=[RawFrame(data=b"x")],
        )  # fmt: skip
        req = EngineRequest(
            request_id=f"s{k}", messages=tuple(build_messages(step, frames, layout)),
            images=tuple(frames),
        )  # fmt: skip
        out.append(render_prompt(req, sim))
    return out


def cached_tokens(prompt: list[str], earlier: list[list[str]], block: int) -> int:
    """What an unbounded block cache holding `earlier` serves of `prompt` (sim's rule)."""
    shared = max((common_prefix(p, prompt) for p in earlier), default=0)
    return min(shared // block, (len(prompt) - 1) // block) * block


@dataclass(frozen=True)
class LayoutCost:
    layout: AgentLayout
    window: int
    prompt_tokens: tuple[int, ...]  # per step
    cached_tokens: tuple[int, ...]  # per step

    @property
    def prefill(self) -> tuple[int, ...]:
        return tuple(p - c for p, c in zip(self.prompt_tokens, self.cached_tokens, strict=True))

    def mean_prefill(self, skip_first: bool = True) -> float:
        values = self.prefill[1:] if skip_first else self.prefill
        return sum(values) / len(values)

    def hit_rate(self) -> float:
        """Cached / prompt tokens over the steps after the first (as `sy agent-sim`)."""
        return sum(self.cached_tokens[1:]) / sum(self.prompt_tokens[1:])


def layout_cost(
    layout: AgentLayout, window: int = 8, steps: int = 20, width: int = 1280, height: int = 720
) -> LayoutCost:
    prompts = episode_tokens(layout, window, steps, width, height)
    block = SimSettings().block_size
    cached = tuple(cached_tokens(p, prompts[:k], block) for k, p in enumerate(prompts))
    return LayoutCost(layout, window, tuple(len(p) for p in prompts), cached)


def table(steps: int = 20, width: int = 1280, height: int = 720) -> str:
    """The docstring table: one row per (layout, W)."""
    lines = [
        "| layout | W | prompt tokens, mean / max "
        "| prefill per step, mean (min-max) | ideal hit rate |",
        "| --- | --- | --- | --- | --- |",
    ]
    for layout, window in TABLE_ROWS:
        c = layout_cost(layout, window or 8, steps, width, height)
        later = c.prefill[1:]
        mean_prompt = sum(c.prompt_tokens) / len(c.prompt_tokens)
        lines.append(
            f"| {layout} | {window or '-'} | {mean_prompt:,.0f} / {max(c.prompt_tokens):,} "
            f"| {c.mean_prefill():,.0f} ({min(later):,}-{max(later):,}) "
            f"| {100 * c.hit_rate():.1f} % |"
        )
    return "\n".join(lines)


def rewrite_docstring(path: Path, new_table: str) -> bool:
    """Replace the layout table in `path` (agentprompt.py) by `new_table`; True if it changed."""
    text = path.read_text()
    head = new_table.splitlines()[0]
    start = text.index(head)
    end = text.index("\n\n", start)
    updated = text[:start] + new_table + text[end:]
    if updated == text:
        return False
    path.write_text(updated)
    return True


def main(argv: list[str]) -> None:
    """Print the table; with `--write`, also put it in agentprompt's docstring."""
    out = table()
    print(out)
    if "--write" in argv:
        changed = rewrite_docstring(Path(agentprompt.__file__), out)
        print(f"{agentprompt.__file__}: {'rewritten' if changed else 'unchanged'}")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
