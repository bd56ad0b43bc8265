"""How much n-gram speculative decoding would accept of agent answers, per answer format.

vLLM's n-gram ("prompt lookup") speculation proposes, before each decode step, the
tokens that followed the longest earlier occurrence of the sequence's last few tokens
(`sim_output.ngram_steps` models it). Agent answers are templated (the action names,
JSON's keys, the history's earlier actions are all in the prompt), so part of each
answer is predictable; its coordinates are not.

This measures it on the sim's own streams: 20-step episodes laid out as the
preprocessor does (`agentprompt.build_messages`, `window` of 8, the format's system
prompt, the history as `sy agent-sim` records it), rendered by the sim's
pseudo-tokenizer, each step's answer the sim engine's (`sim_answer`). Per format and
setting: the acceptance rate (accepted / drafted tokens), tokens per decode step
(emitted / steps, the first token's prefill step not counted), and the verified
tokens the drafts add per emitted token (what they cost: each is computed like a
prefill token). `python -m switchyard.bench.specaccept` prints the table the README
quotes.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

from switchyard.agentactions import ACTION_FORMATS, parse_actions
from switchyard.agentprompt import DEFAULT_LAYOUT, DEFAULT_WINDOW, build_messages, fit
from switchyard.bench.agentsim import history_entry
from switchyard.bench.layoutcost import frame_image, frame_steps
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_output import PROMPT_LOOKUP, ngram_steps, sim_answer
from switchyard.engines.sim_tokens import pseudo_tokens, render_prompt
from switchyard.messages.agent import ActionFormat, AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import ActionsConstraint

# (k, prompt_lookup_min, prompt_lookup_max) measured: vLLM's defaults (k 5 is the docs'
# example, 5/5 its lookup default) and shorter lookups.
SETTINGS: tuple[tuple[int, int, int], ...] = ((5, 5, 5), (4, 2, 4), (2, *PROMPT_LOOKUP))


@dataclass(frozen=True)
class Acceptance:
    fmt: ActionFormat
    k: int
    lookup: tuple[int, int]
    drafted: int
    accepted: int
    emitted: int  # output tokens after the first
    steps: int  # decode steps after the first token

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 1.0

    @property
    def verified_per_token(self) -> float:
        return self.drafted / self.emitted if self.emitted else 0.0


def measure(
    fmt: ActionFormat, k: int, n_min: int, n_max: int, episodes: int = 6, steps: int = 20
) -> Acceptance:
    """Speculation over `episodes` sim episodes of `steps` steps in `fmt`."""
    sim = SimSettings()
    size = fit(1280, 720, sim.image_max_pixels, sim.image_patch_px)
    drafted = accepted = emitted = decode_steps = 0
    for e in range(episodes):
        rng = random.Random(e)
        history: list[str] = []
        for step_no in range(steps):
            frames = [frame_image(f"ep{e}", s, size)
                      for s in frame_steps(DEFAULT_LAYOUT, step_no, DEFAULT_WINDOW)]  # fmt: skip
            step = AgentStep(
                tenant="t", session=f"ep{e}", frame_ts=0.0, step=step_no, history=history,
                goal="collect the daily reward", frames=[RawFrame(data=b"x")],
                options=StepOptions(action_format=fmt),
            )  # fmt: skip
            req = EngineRequest(
                request_id=f"{e}-{step_no}", images=tuple(frames),
                messages=tuple(build_messages(step, frames, DEFAULT_LAYOUT)),
                constraint=ActionsConstraint(action_format=fmt),
            )  # fmt: skip
            answer = sim_answer(ActionsConstraint(action_format=fmt), req, rng, "relative-1000")
            out = pseudo_tokens(answer)
            for s in ngram_steps(render_prompt(req, sim), out, k, n_min, n_max):
                drafted, accepted = drafted + s.drafted, accepted + s.accepted
                emitted, decode_steps = emitted + s.emitted, decode_steps + 1
            history = [*history, history_entry(parse_actions(answer, fmt), fmt)]
    return Acceptance(fmt, k, (n_min, n_max), drafted, accepted, emitted, decode_steps)


def table() -> str:
    lines = [
        "| format | k | lookup | acceptance | tokens per decode step | verified per token |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fmt in ACTION_FORMATS:
        for k, lo, hi in SETTINGS:
            a = measure(fmt, k, lo, hi)
            lines.append(
                f"| {fmt} | {k} | {lo}-{hi} | {100 * a.rate:.0f} % | {a.tokens_per_step:.2f} "
                f"| {a.verified_per_token:.2f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    sys.stdout.flush()
