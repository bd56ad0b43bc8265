"""What the simulator answers: the output tokens of a request, planned up front.

`SimEngine` produces no meaningful text, but its outputs have the shape the
request asked for, because that is what callers and load tests observe:

- no constraint: exactly `max_tokens` filler words (finish ``"length"``);
- a JSON schema: a small valid instance (`schema_instance`), a JSON-object
  constraint: ``{}``;
- a choice: one of the choices, drawn from the request's generator (so the same
  prompt picks the same one, as greedy decoding would);
- an agent step's actions (`ActionsConstraint`): `sim_answer`, exactly `chunk`
  actions of a game-like mix within the current frame, in the coordinates of
  the simulated VLM (`SimSettings.vlm`: resized-frame pixels or 0-1000) and
  written in the step's format (`agentactions.encode_answer`), so it parses
  and maps like a model's;
- a grammar or regex: `CONSTRAINED_PLACEHOLDER`, a fixed text the simulator
  cannot make match (it cannot sample from an arbitrary GBNF grammar or regex;
  its token count is what matters for timing, and callers must not validate it);
- either way cut at `max_tokens` (``"length"``) and at the first stop string,
  which is not returned (``"stop"``), as vLLM does;
- with speculative decoding on (`SimSettings.speculative_tokens`), how many tokens
  each decode step emits (`ngram_steps`).

The whole output is planned when the request is submitted, so the engine knows
how many KV blocks to reserve; it then emits one piece per decode step.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.agentactions import (
    FORMAT_COORDS,
    MAX_TYPED_CHARS,
    Answer,
    encode_answer,
    is_wrapped,
)
from switchyard.engines.base import EngineRequest
from switchyard.engines.schema_instance import schema_instance
from switchyard.engines.sim_tokens import WORDS, pseudo_tokens
from switchyard.messages.agent import (
    MAX_THOUGHT_CHARS,
    Action,
    Back,
    Click,
    Done,
    LongPress,
    Swipe,
    TypeText,
    Wait,
)
from switchyard.messages.inference import (
    ActionsConstraint,
    ChoiceConstraint,
    FinishReason,
    GrammarConstraint,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    RegexConstraint,
)
from switchyard.vlmgeometry import RELATIVE_SCALE, Coords

# What grammar- and regex-constrained requests get: the simulator cannot sample
# from an arbitrary GBNF grammar or regex, so it answers this fixed text (its
# token count is what matters for timing). Callers must not validate it.
CONSTRAINED_PLACEHOLDER = "sim constrained output"


@dataclass(frozen=True)
class SimOutput:
    """The tokens a request will emit, decided at submission, and why it ends."""

    pieces: tuple[str, ...]  # text of each output token
    finish: FinishReason


def plan_output(request: EngineRequest, rng: random.Random, coords: Coords = "pixels") -> SimOutput:
    """The whole output of `request`, drawn from `rng` (see the module docstring); agent
    answers write points in `coords`."""
    max_tokens = request.sampling.max_tokens
    c = request.constraint
    if isinstance(c, JsonSchemaConstraint):
        text = json.dumps(schema_instance(c.json_schema, rng), separators=(",", ":"))
    elif isinstance(c, JsonObjectConstraint):
        text = "{}"
    elif isinstance(c, ChoiceConstraint):
        text = rng.choice(c.choices)
    elif isinstance(c, ActionsConstraint):
        text = sim_answer(c, request, rng, coords)
    elif isinstance(c, GrammarConstraint | RegexConstraint):
        text = CONSTRAINED_PLACEHOLDER
    else:
        words = [rng.choice(WORDS) for _ in range(max_tokens)]
        return _stop_at(tuple([words[0], *(" " + w for w in words[1:])]), "length", request)
    pieces = pseudo_tokens(text)
    if len(pieces) > max_tokens:
        return _stop_at(tuple(pieces[:max_tokens]), "length", request)
    return _stop_at(tuple(pieces), "stop", request)


def _stop_at(pieces: tuple[str, ...], finish: FinishReason, request: EngineRequest) -> SimOutput:
    """Cut at the first stop string, as vLLM does: the stop text is not returned."""
    text = "".join(pieces)
    found = [(i, s) for s in request.sampling.stop if s and (i := text.find(s)) >= 0]
    if not found:
        return SimOutput(pieces, finish)
    cut, stop = min(found)
    end, n = 0, 0
    while end < cut + len(stop):
        end += len(pieces[n])
        n += 1
    out, pos = [], 0
    for piece in pieces[:n]:
        out.append(text[pos : min(pos + len(piece), cut)] if pos < cut else "")
        pos += len(piece)
    return SimOutput(tuple(out), "stop")


# What a game agent does, roughly: mostly taps, some swipes, presses and waits,
# rarely text, back or done. Weights, in `ACTION_KINDS` order.
ACTION_KINDS = ("click", "swipe", "long_press", "wait", "type", "back", "done")
ACTION_WEIGHTS = (50, 15, 10, 10, 5, 5, 5)
# Frame size when a request carries no image (the 720p frame the agent path targets).
DEFAULT_FRAME = (1280, 720)


def sim_action(kind: str, width: int, height: int, rng: random.Random) -> Action:
    """One action of `kind` on a `width` x `height` frame, drawn from `rng`."""

    def point() -> tuple[int, int]:
        return rng.randrange(width), rng.randrange(height)

    if kind == "click":
        x, y = point()
        return Click(x=x, y=y)
    if kind == "long_press":
        x, y = point()
        return LongPress(x=x, y=y, ms=rng.choice((500, 800, 1000, 1500)))
    if kind == "swipe":
        (x1, y1), (x2, y2) = point(), point()
        return Swipe(x1=x1, y1=y1, x2=x2, y2=y2, ms=rng.choice((200, 250, 300, 500)))
    if kind == "wait":
        return Wait(ms=rng.choice((200, 500, 1000, 2000)))
    if kind == "type":
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        return TypeText(text=words[:MAX_TYPED_CHARS])
    return Back() if kind == "back" else Done()


def sim_answer(
    c: ActionsConstraint, request: EngineRequest, rng: random.Random, coords: Coords = "pixels"
) -> str:
    """A valid answer for an agent step: `c.chunk` actions (a model asked for a chunk
    fills it) within the current frame (the request's last image; with `relative-1000`
    coordinates, the profile's or the format's, 0-1000 on each axis whatever its size),
    a short thought when one is allowed, in `c.action_format`."""
    last = request.images[-1] if request.images else None
    width, height = (last.width, last.height) if last is not None else DEFAULT_FRAME
    if (FORMAT_COORDS[c.action_format] or coords) == "relative-1000":
        width = height = RELATIVE_SCALE + 1  # 1000 itself is a point a model may name
    kinds = rng.choices(ACTION_KINDS, ACTION_WEIGHTS, k=c.chunk)
    actions = tuple(sim_action(k, width, height, rng) for k in kinds)
    thought = None
    if c.thought:
        thought = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        thought = thought[:MAX_THOUGHT_CHARS]
    answer = Answer(actions, thought)
    return encode_answer(answer, c.action_format, wrapped=is_wrapped(c.chunk, c.thought))


# -- speculative decoding ----------------------------------------------------------------

# (prompt_lookup_min, prompt_lookup_max) when speculation is on and nothing says otherwise.
# vLLM defaults both to 5 ("arbitrarily chosen", vllm/config/speculative.py); an action's
# template is short, so shorter n-grams find more (`python -m switchyard.bench.specaccept`:
# 1-3 accepts the most). `VllmSettings` defaults to the same.
PROMPT_LOOKUP = (1, 3)


@dataclass(frozen=True)
class DraftStep:
    """One decode step under n-gram speculation: tokens proposed, tokens it emits (the
    accepted ones and the one the verifying pass samples itself)."""

    drafted: int
    accepted: int
    emitted: int


def ngram_steps(
    context: Sequence[str], output: Sequence[str], k: int, n_min: int, n_max: int
) -> tuple[DraftStep, ...]:
    """The decode steps after the first token of `output` (the prefill step's) under
    vLLM's n-gram speculation (`vllm/v1/spec_decode/ngram_proposer.py`,
    `_find_longest_matched_ngram_and_propose_tokens`): before each step the longest
    suffix of prompt + output so far, `n_min`..`n_max` tokens, that occurs earlier is
    looked up, and the up to `k` tokens after its earliest occurrence are proposed; the
    step verifies them and emits the accepted prefix plus one token of its own.

    The sim's output is planned, so how many a greedy model would accept is known: the
    proposal's common prefix with the real next tokens. N-grams holding a visual token
    are never indexed (an answer holds none, so they can never match its suffix)."""
    seq = [*context, *output[:1]]
    earliest: dict[tuple[str, ...], int] = {}  # n-gram -> end of its earliest occurrence
    indexed = 0  # n-grams ending at positions <= indexed are in `earliest`
    steps: list[DraftStep] = []
    i = 1  # output tokens emitted
    while i < len(output):
        end = len(seq)
        for e in range(indexed + 1, end):  # every n-gram ending before the suffix
            for n in range(n_min, min(n_max, e) + 1):
                gram = tuple(seq[e - n : e])
                if not any(t.startswith("<img:") for t in gram):
                    earliest.setdefault(gram, e)
        indexed = max(indexed, end - 1)
        draft: list[str] = []
        for n in range(min(n_max, end), n_min - 1, -1):
            at = earliest.get(tuple(seq[end - n :]))
            if at is not None:
                draft = seq[at : at + k]
                break
        accepted = 0
        while accepted < len(draft) and i + accepted < len(output):
            if draft[accepted] != output[i + accepted]:
                break
            accepted += 1
        emitted = min(1 + accepted, len(output) - i)
        steps.append(DraftStep(len(draft), min(accepted, emitted), emitted))
        seq.extend(output[i : i + emitted])
        i += emitted
    return tuple(steps)
