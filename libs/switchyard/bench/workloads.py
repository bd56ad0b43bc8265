"""What a load test sends: seeded request generators for the fleet's workloads.

- `chat`: synthetic chat requests whose prompt and output lengths follow log-normal
  distributions (the long right tail real prompts have); a system prompt shared by
  all, so a prefix cache sees what it would in production.
- `agent`: multi-step episodes of the cloud-phone simulator (`phoneframes`): each
  request is the next step of one of `sessions` live episodes (previous + current
  frame, the action history), a new episode starting when one ends.
- `sql`: a mix of analysts' questions (by default the first questions of
  `evals/sql/game-ops.yaml`'s categories, built in), for the Text2SQL path.
- `mixed`: each request drawn from the three by weight.

A generator is a pure function of its seed and the order of calls: the same seed
gives the same requests in the same order.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from switchyard.bench.phoneframes import draw_frame

Kind = Literal["chat", "agent", "sql"]
WorkloadName = Literal["chat", "agent", "sql", "mixed"]
WORKLOADS: tuple[WorkloadName, ...] = ("chat", "agent", "sql", "mixed")


class WorkloadError(ValueError):
    """A workload that cannot be built (unknown name, bad weights or shape)."""


@dataclass(frozen=True)
class ChatShape:
    """Log-normal token counts: median and sigma (of the log); capped."""

    input_median: int = 128
    input_sigma: float = 0.6
    output_median: int = 32
    output_sigma: float = 0.5
    max_input: int = 2048
    max_output: int = 256
    # Conversations the requests belong to (their `session`): the router partitions by
    # session, so this is how widely chat spreads over the workers.
    conversations: int = 64

    def __post_init__(self) -> None:
        if min(self.input_median, self.output_median, self.max_input, self.max_output,
               self.conversations) < 1:  # fmt: skip
            raise WorkloadError("chat token counts must be >= 1")
        if self.input_sigma < 0 or self.output_sigma < 0:
            raise WorkloadError("chat sigmas must be >= 0")


@dataclass(frozen=True)
class AgentShape:
    sessions: int = 16  # live episodes at once
    steps: int = 10  # steps per episode
    frame_size: tuple[int, int] = (640, 360)
    frame_pool: int = 8  # frames drawn once and cycled: drawing is harness CPU, not load
    max_tokens: int = 48
    stale_after: float = 5.0

    def __post_init__(self) -> None:
        if min(self.sessions, self.steps, self.frame_pool) < 1 or self.max_tokens < 8:
            raise WorkloadError("agent sessions, steps, frame pool >= 1 and max_tokens >= 8")


# One question per category of evals/sql/game-ops.yaml, so the mix spans the paths
# (metric, verified query, free generation) without reading the repository at run time.
SQL_QUESTIONS: tuple[str, ...] = (
    "What was DAU yesterday?",
    "Active players per server yesterday",
    "How many new sign-ups did we get yesterday?",
    "What is D1 retention for the last 7 mature cohorts?",
    "What was revenue yesterday?",
    "Revenue by pay tier over the last 30 days",
    "How many paying users did we have yesterday?",
    "Payments by provider yesterday",
)

SYSTEM_PROMPT = (
    "You are the support assistant of a mobile game studio. Answer briefly and precisely; "
    "if you do not know, say so."
)
_WORDS = [
    "player",
    "level",
    "quest",
    "reward",
    "server",
    "guild",
    "season",
    "event",
    "shop",
    "item",
    "coin",
    "gem",
    "battle",
    "map",
    "hero",
    "skill",
    "upgrade",
    "login",
    "daily",
    "weekly",
    "rank",
    "match",
    "team",
    "chat",
    "friend",
    "report",
    "bug",
    "patch",
    "update",
    "crash",
    "lag",
    "matchmaking",
    "tournament",
    "pass",
    "bundle",
    "refund",
    "account",
    "device",
    "android",
    "ios",
]


@dataclass(frozen=True)
class RequestSpec:
    """One request to send; `kind` says which fields matter."""

    index: int
    kind: Kind
    tenant: str
    max_tokens: int = 0
    # chat
    messages: tuple[tuple[str, str], ...] = ()  # (role, content)
    session: str = ""  # the episode (agent) or conversation (chat)
    # agent
    step: int = 0
    frames: tuple[bytes, ...] = ()  # (previous,) current
    goal: str = ""
    history: tuple[str, ...] = ()
    stale_after: float = 5.0
    # sql
    question: str = ""


_frame = functools.lru_cache(maxsize=64)(draw_frame)


def _lognormal(rng: random.Random, median: int, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(median * math.exp(rng.gauss(0.0, sigma)))))


@dataclass
class _Episode:
    id: int
    step: int = 0
    history: list[str] = field(default_factory=list)


class Workload:
    """`next()` returns the next request; deterministic for a given seed."""

    def __init__(
        self,
        name: WorkloadName,
        *,
        seed: int = 0,
        tenants: Mapping[Kind, str] | None = None,
        weights: Mapping[Kind, float] | None = None,
        chat: ChatShape = ChatShape(),
        agent: AgentShape = AgentShape(),
        questions: Sequence[str] = SQL_QUESTIONS,
        run: str = "run",
    ) -> None:
        if name not in WORKLOADS:
            raise WorkloadError(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
        if not questions:
            raise WorkloadError("the sql workload needs at least one question")
        self.name = name
        self.rng = random.Random(seed)
        self.tenants: dict[Kind, str] = {"chat": "bench", "agent": "bench", "sql": "acme"}
        self.tenants.update(tenants or {})
        self.weights = self._weights(name, weights)
        self.chat, self.agent, self.questions = chat, agent, tuple(questions)
        # The run id keeps two runs on one fleet from finding each other's prompts cached.
        self.run = run
        self._count = 0
        self._episodes = [_Episode(i) for i in range(agent.sessions)]
        self._next_episode = agent.sessions

    @staticmethod
    def _weights(name: WorkloadName, weights: Mapping[Kind, float] | None) -> dict[Kind, float]:
        if name != "mixed":
            return {name: 1.0}
        w: dict[Kind, float] = dict(weights or {"agent": 0.6, "chat": 0.3, "sql": 0.1})
        bad = [k for k in w if k not in ("chat", "agent", "sql")]
        if bad or any(v < 0 or not math.isfinite(v) for v in w.values()) or sum(w.values()) <= 0:
            raise WorkloadError(f"mixed weights must be >= 0 over chat/agent/sql, got {w}")
        return w

    def next(self) -> RequestSpec:
        kinds = list(self.weights)
        kind = kinds[0] if len(kinds) == 1 else self.rng.choices(
            kinds, weights=[self.weights[k] for k in kinds]
        )[0]  # fmt: skip
        i = self._count
        self._count += 1
        if kind == "chat":
            return self._chat(i)
        if kind == "agent":
            return self._agent(i)
        return RequestSpec(
            index=i, kind="sql", tenant=self.tenants["sql"],
            question=self.questions[self.rng.randrange(len(self.questions))],
        )  # fmt: skip

    def take(self, n: int) -> list[RequestSpec]:
        return [self.next() for _ in range(n)]

    def _chat(self, i: int) -> RequestSpec:
        s = self.chat
        n_in = _lognormal(self.rng, s.input_median, s.input_sigma, s.max_input)
        n_out = _lognormal(self.rng, s.output_median, s.output_sigma, s.max_output)
        words = " ".join(self.rng.choice(_WORDS) for _ in range(n_in))
        user = f"[{self.run}#{i}] Summarise this player report: {words}"
        return RequestSpec(
            index=i, kind="chat", tenant=self.tenants["chat"], max_tokens=n_out,
            messages=(("system", SYSTEM_PROMPT), ("user", user)),
            session=f"{self.run}-c{self.rng.randrange(s.conversations)}",
        )  # fmt: skip

    def _agent(self, i: int) -> RequestSpec:
        a = self.agent
        slot = self.rng.randrange(len(self._episodes))
        ep = self._episodes[slot]
        pool = a.frame_pool
        cur = _frame(ep.id % 997, ep.step % pool, a.frame_size)
        frames = (cur,) if ep.step == 0 else (_frame(ep.id % 997, (ep.step - 1) % pool,
                                                     a.frame_size), cur)  # fmt: skip
        spec = RequestSpec(
            index=i, kind="agent", tenant=self.tenants["agent"], max_tokens=a.max_tokens,
            session=f"{self.run}-e{ep.id}", step=ep.step, frames=frames,
            goal=f"collect the daily reward (episode {self.run}-e{ep.id})",
            history=tuple(ep.history[-50:]), stale_after=a.stale_after,
        )  # fmt: skip
        # The history a real phone would send: the actions so far. The harness cannot wait
        # for the answer in an open loop, so it records the step's ordinal instead.
        ep.history.append(f'{{"type":"wait","step":{ep.step}}}')
        ep.step += 1
        if ep.step >= a.steps:
            self._episodes[slot] = _Episode(self._next_episode)
            self._next_episode += 1
        return spec
