"""What the simulator answers: the output tokens of a request, planned up front.

`SimEngine` produces no meaningful text, but its outputs have the shape the
request asked for, because that is what callers and load tests observe:

- no constraint: exactly `max_tokens` filler words (finish ``"length"``);
- a JSON schema: a small valid instance (`schema_instance`), a JSON-object
  constraint: ``{}``;
- a choice: one of the choices, drawn from the request's generator (so the same
  prompt picks the same one, as greedy decoding would);
- a grammar or regex: `CONSTRAINED_PLACEHOLDER`, a fixed text the simulator
  cannot make match (it cannot sample from an arbitrary GBNF grammar or regex;
  its token count is what matters for timing, and callers must not validate it);
- either way cut at `max_tokens` (``"length"``) and at the first stop string,
  which is not returned (``"stop"``), as vLLM does.

The whole output is planned when the request is submitted, so the engine knows
how many KV blocks to reserve; it then emits one piece per decode step.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from switchyard.engines.base import EngineRequest
from switchyard.engines.schema_instance import schema_instance
from switchyard.engines.sim_tokens import WORDS, pseudo_tokens
from switchyard.messages.inference import (
    ChoiceConstraint,
    FinishReason,
    GrammarConstraint,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    RegexConstraint,
)

# What grammar- and regex-constrained requests get: the simulator cannot sample
# from an arbitrary GBNF grammar or regex, so it answers this fixed text (its
# token count is what matters for timing). Callers must not validate it.
CONSTRAINED_PLACEHOLDER = "sim constrained output"


@dataclass(frozen=True)
class SimOutput:
    """The tokens a request will emit, decided at submission, and why it ends."""

    pieces: tuple[str, ...]  # text of each output token
    finish: FinishReason


def plan_output(request: EngineRequest, rng: random.Random) -> SimOutput:
    """The whole output of `request`, drawn from `rng` (see the module docstring)."""
    max_tokens = request.sampling.max_tokens
    c = request.constraint
    if isinstance(c, JsonSchemaConstraint):
        text = json.dumps(schema_instance(c.json_schema, rng), separators=(",", ":"))
    elif isinstance(c, JsonObjectConstraint):
        text = "{}"
    elif isinstance(c, ChoiceConstraint):
        text = rng.choice(c.choices)
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
