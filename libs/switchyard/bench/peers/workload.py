"""The requests of both runs, built once and sent to every column the same way.

- Overhead: short chat prompts, a few output tokens, no constraint.
- Routing: the simulated agent workload of `sy bench route` (its system prompt, 1280x720
  frames, the Action JSON schema, 48 max tokens): `sessions` episodes of `steps` steps;
  step k's user turn is ``history | frame k-1 | frame k | query`` (old frame first, so the
  previous step's prompt is a prefix up to its history). Over HTTP a frame is a marker the
  sim server expands into visual tokens (`simserver.frames`); over NATS it is an image part
  with the same hash and size, so every column's engines prefill the same tokens.
  The session id travels in the `X-Session-ID` header and in `user` (HTTP) and in the
  envelope's `session` (NATS).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from pydantic import RootModel

from switchyard.bench.route import FRAME, MAX_TOKENS, SYSTEM_PROMPT
from switchyard.messages.agent import Action
from switchyard.messages.inference import (
    ChatMessage,
    GenerateRequest,
    Image,
    ImagePart,
    JsonSchemaConstraint,
    Sampling,
    TextPart,
)
from switchyard.simserver.frames import frame_marker

OVERHEAD_PROMPTS = (
    "Describe the main menu of a mobile strategy game.",
    "List five things a player can do in a farming game.",
    "Explain how a daily login reward works.",
    "Write a short note about a server maintenance window.",
)


class _ActionAnswer(RootModel[Action]):
    """One action: the schema an agent step constrains its answer to."""


ACTION_SCHEMA: dict[str, Any] = _ActionAnswer.model_json_schema()


def overhead_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{OVERHEAD_PROMPTS[i % len(OVERHEAD_PROMPTS)]} (#{i})"}]


@dataclass(frozen=True)
class AgentStep:
    seed: int
    session: int
    step: int
    history: tuple[str, ...]

    @property
    def session_id(self) -> str:
        return f"s{self.session}"

    def frames(self) -> list[Image]:
        return [
            _frame(self.seed, self.session, k) for k in range(max(0, self.step - 1), self.step + 1)
        ]

    def _texts(self) -> tuple[str, str]:
        lines = "\n".join(f"{k}: {a}" for k, a in enumerate(self.history)) or "(none yet)"
        return f"Actions so far:\n{lines}\n", f"Step {self.step}: what is the next action?"

    def openai_body(self, model: str, *, stream: bool) -> dict[str, Any]:
        head, query = self._texts()
        markers = "".join(frame_marker(f.hash, f.width, f.height) for f in self.frames())
        body: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": head + markers + query},
            ],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "response_format": {
                "type": "json_schema", "json_schema": {"name": "action", "schema": ACTION_SCHEMA},
            },
            "user": self.session_id,
            "stream": stream,
        }  # fmt: skip
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def headers(self) -> dict[str, str]:
        return {"X-Session-ID": self.session_id}

    def generate_request(self, tenant: str, pool: str, deadline: float) -> GenerateRequest:
        head, query = self._texts()
        frames = self.frames()
        parts: list[TextPart | ImagePart] = [
            TextPart(text=head),
            *(ImagePart(hash=f.hash) for f in frames),
            TextPart(text=query),
        ]
        return GenerateRequest(
            tenant=tenant,
            workload="llm",
            pool=pool,
            session=self.session_id,
            messages=[
                ChatMessage(role="system", content=SYSTEM_PROMPT),
                ChatMessage(role="user", content=parts),
            ],
            images=frames,
            sampling=Sampling(max_tokens=MAX_TOKENS, temperature=0.0),
            constraint=JsonSchemaConstraint(json_schema=ACTION_SCHEMA),
            prompt_tokens=3000,
            deadline=deadline,
            stream=True,
        )


def _frame(seed: int, session: int, step: int) -> Image:
    digest = hashlib.blake2b(f"{seed}:{session}:{step}".encode(), digest_size=16).hexdigest()
    return Image(hash=digest, data=b"", mime="image/png", width=FRAME[0], height=FRAME[1])
