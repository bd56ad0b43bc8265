"""The requests of the routing benchmarks, built once and sent the same way to every policy.

`sy bench route` sends them over NATS (`GenerateRequest`, straight into the router);
`sy bench peers routing` sends the same requests over HTTP (OpenAI bodies) to
vllm-router and smg, and over NATS to Switchyard. Two workloads:

- `agent`: `sessions` episodes of `steps` steps, all running at once, each a closed loop
  (step k+1 is sent when step k's action is complete, and that action joins the history).
  Step k's prompt is ``system prompt (shared) | action history | frame k-1 | frame k |
  query`` with 1280x720 frames whose content hash is fixed per (seed, session, step), so
  step k's current frame is step k+1's previous frame, and an Action-schema constrained
  answer. Every step carries its episode as `session` (NATS) or `X-Session-ID` and `user`
  (HTTP). Over HTTP a frame is a marker the sim server expands into visual tokens
  (`simserver.frames`); over NATS it is an image part with the same hash and size, so
  both prefill the same tokens.
- `chat`: `tenants` tenants, each with its own system prompt (a few hundred tokens),
  and traffic skewed by a Zipf law (exponent `skew`: the busiest of 6 tenants sends ~38 %
  of the requests). Jobs are conversations of `turns` turns (turn k+1 repeats the whole
  conversation so far, answers included) and one-shot requests (system prompt and one
  question). Every question comes with the log excerpt an operator pastes (~300-400
  tokens), so by the later turns the conversation, which only the worker that served
  its last turn holds, outweighs the system prompt that every worker soon holds. Jobs
  are shuffled once and run by `concurrency` client lanes, each taking the next
  job when its last one is done. Chat requests carry no session: a router can only place
  them by their content (Switchyard's router keys them by tenant and prompt prefix).

A warm worker can serve from its prefix cache what an earlier request left there: the
system prompt and, for the agent, the history up to the previous step (the previous
frame follows a history one action longer, so it is computed again whatever the policy);
for chat, the whole earlier conversation.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import RootModel

from switchyard.agentprompt import visual_tokens
from switchyard.bench.peers.clients import Outcome
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
from switchyard.token_estimate import estimate_tokens

WorkloadName = Literal["agent", "chat"]
WORKLOADS: tuple[WorkloadName, ...] = ("agent", "chat")

FRAME = (1280, 720)  # a phone screen in landscape: 900 visual tokens in the sim (qwen3-vl)
MAX_TOKENS = 48  # the agent default (StepOptions); Action answers are ~20 tokens
IMAGE_FRAMING_TOKENS = 2  # <|vision_start|> and <|vision_end|> around each frame

SYSTEM_PROMPT = (
    "You are an agent that plays a mobile game on a cloud phone. Every step you "
    "receive the previous screenshot, the current screenshot and the actions you "
    "have taken so far in this episode. Compare the two screenshots to see what "
    "your last action changed, then answer with exactly one next action as a JSON "
    "object and nothing else. Actions: click at x, y in screen pixels; long_press "
    "at x, y for ms milliseconds; swipe from x1, y1 to x2, y2 over ms milliseconds; "
    "type a short text into the focused field; back to press the system back "
    "button; wait for ms milliseconds when the screen is loading or animating; "
    "done when the goal of the episode is reached. Rules: never tap ads or "
    "purchase buttons; close pop-ups with their close button or back; if the same "
    "action failed twice, try a different one; prefer waiting over tapping while a "
    "spinner is visible; keep coordinates inside the screen; answer quickly. The "
    "screen is 1280 pixels wide and 720 pixels high, with the origin at the top "
    "left corner. Dialogs usually have their confirm button at the bottom right "
    "and their close button at the top right. When a tutorial hand points at a "
    "button, click that button. When the goal needs text, click the field first, "
    "then type. Do not explain your answer."
)


class _ActionAnswer(RootModel[Action]):
    """One action: the JSON schema an agent step constrains its answer to."""


ACTION_SCHEMA: dict[str, Any] = _ActionAnswer.model_json_schema()


class BenchRequest(Protocol):
    """One request of a workload, as every client sends it."""

    @property
    def tenant(self) -> str: ...

    @property
    def thread(self) -> str:
        """The episode or conversation it belongs to (stickiness is counted per thread)."""
        ...

    @property
    def index(self) -> int:
        """Its step or turn in that thread, from 0."""
        ...

    def openai_body(self, model: str, *, stream: bool) -> dict[str, Any]: ...

    def headers(self) -> dict[str, str]: ...

    def generate_request(
        self, pool: str, deadline: float, *, stream: bool = True
    ) -> GenerateRequest: ...


def _openai(
    model: str, messages: list[dict[str, Any]], max_tokens: int, stream: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": stream,
    }  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


# -- agent ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentStep:
    seed: int
    session: int
    step: int
    history: tuple[str, ...]
    tenant: str = "bench"

    @property
    def session_id(self) -> str:
        return f"s{self.session}"

    @property
    def thread(self) -> str:
        return self.session_id

    @property
    def index(self) -> int:
        return self.step

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
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": head + markers + query},
        ]
        body = _openai(model, messages, MAX_TOKENS, stream)
        body["response_format"] = {
            "type": "json_schema", "json_schema": {"name": "action", "schema": ACTION_SCHEMA},
        }  # fmt: skip
        body["user"] = self.session_id
        return body

    def headers(self) -> dict[str, str]:
        return {"X-Session-ID": self.session_id}

    def generate_request(
        self, pool: str, deadline: float, *, stream: bool = True
    ) -> GenerateRequest:
        head, query = self._texts()
        frames = self.frames()
        parts: list[TextPart | ImagePart] = [
            TextPart(text=head),
            *(ImagePart(hash=f.hash) for f in frames),  # the old frame first
            TextPart(text=query),
        ]
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=parts),
        ]
        # The preprocessor's estimate (`services.preprocessor.layout`): text + visual tokens.
        visual = sum(visual_tokens(f.width, f.height) + IMAGE_FRAMING_TOKENS for f in frames)
        return GenerateRequest(
            tenant=self.tenant, workload="agent", pool=pool, session=self.session_id,
            messages=messages, images=frames,
            sampling=Sampling(max_tokens=MAX_TOKENS, temperature=0.0),
            constraint=JsonSchemaConstraint(json_schema=ACTION_SCHEMA),
            prompt_tokens=estimate_tokens(messages) + visual, deadline=deadline, stream=stream,
        )  # fmt: skip


def _frame(seed: int, session: int, step: int) -> Image:
    # The hash names the frame, so the same (session, step) is the same image in both
    # prompts that carry it. The sim counts visual tokens from the size only.
    digest = hashlib.blake2b(f"{seed}:{session}:{step}".encode(), digest_size=16).hexdigest()
    return Image(hash=digest, data=b"", mime="image/png", width=FRAME[0], height=FRAME[1])


# -- chat -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatConfig:
    tenants: int = 6
    conversations: int = 160
    turns: int = 6
    one_shots: int = 96
    concurrency: int = 64  # client lanes, each running one job at a time
    skew: float = 0.9  # Zipf exponent of the tenants' shares
    seed: int = 0

    @property
    def requests(self) -> int:
        return self.conversations * self.turns + self.one_shots

    def shares(self) -> list[float]:
        """Each tenant's share of the jobs (and so of the requests), busiest first."""
        weights = [1.0 / (i + 1) ** self.skew for i in range(self.tenants)]
        total = sum(weights)
        return [w / total for w in weights]


# Output lengths a chat turn asks for (the sim answers exactly max_tokens unconstrained).
CHAT_MAX_TOKENS = (32, 64, 128, 192)

_GAMES = ("Star Harbor", "Rune Valley", "Pocket Kart", "Dragon Post", "Tiny Farms",
          "Neon Tactics", "Cloud Chess", "Ocean Hunt", "Sky Forge", "Mecha Cup")  # fmt: skip
_RULES = (
    "Answer in the player's language and keep answers short unless asked for detail.",
    "Never promise refunds; explain the refund form and the usual processing time instead.",
    "Do not reveal other players' names, levels, purchases or chat messages.",
    "When a player reports a bug, ask for the device model, the game version and the time.",
    "Events run on server time, which is UTC; convert it when the player names a city.",
    "Premium currency bought on one platform cannot be moved to another platform.",
    "Accounts are linked by e-mail; a lost account is recovered through the support form.",
    "Season passes last six weeks and their rewards can be claimed until the next season.",
    "Matchmaking pairs players by rating first and by region second.",
    "A ban is reviewed by a person within two working days of the appeal.",
    "Gift codes are case sensitive and expire at the end of the month they were issued.",
    "Offline progress is stored for up to twelve hours before the idle cap is reached.",
    "Guild leaders can promote officers, start raids and move the guild's banner.",
    "Trading is limited to five items a day between players who are friends for a week.",
    "The daily login reward resets at midnight server time, not at the player's midnight.",
    "If a purchase did not arrive, ask the player to restart the game before anything else.",
    "Parental controls are set in the account settings and need the account's password.",
    "Maintenance is announced a day ahead in the news panel and on the official forum.",
)
_ASKS = (
    "How do I {verb} my {thing} in {place}?", "Why can't I {verb} the {thing} any more?",
    "What happens to my {thing} when I {verb} it during the {event}?",
    "Is there a way to {verb} a {thing} without spending gems?",
    "My friend says the {event} lets you {verb} {thing}s twice, is that true?",
    "Where do I find the {thing} needed to {verb} in {place}?",
)  # fmt: skip
_VERBS = ("upgrade", "trade", "unlock", "repair", "sell", "craft", "claim", "rename")
_THINGS = ("sword", "kart", "pet", "castle", "badge", "skin", "ticket", "banner", "boat")
_PLACES = ("the harbor", "chapter three", "the arena", "the guild hall", "the night market")
_EVENTS = ("spring festival", "double XP weekend", "guild war", "anniversary event")


def _rng(*key: object) -> random.Random:
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def tenant_system_prompt(seed: int, tenant: int) -> str:
    """The tenant's own system prompt, fixed per (seed, tenant): 13-18 of the rules in a
    tenant-specific order, about 360-460 tokens as the sim counts them."""
    rng = _rng("system", seed, tenant)
    game = _GAMES[tenant % len(_GAMES)]
    rules = list(_RULES)
    rng.shuffle(rules)
    head = (
        f"You are the player support assistant of {game}, a mobile game. Tenant "
        f"{tenant} runs its own servers, shop and events; use only what is written "
        "here and in the conversation. "
    )
    body = " ".join(f"Rule {k + 1}: {r}" for k, r in enumerate(rules[: rng.randint(13, 18)]))
    return head + body + " If you are not sure, say so and point the player to the help page."


_LOG_EVENTS = ("login", "purchase", "claim", "match_end", "trade", "crash", "logout", "refund")
_LOG_STATES = ("ok", "pending", "failed", "timeout", "retry")


def _log_excerpt(rng: random.Random) -> str:
    """What an operator pastes with a question: a player's event log, 12-16 lines of
    ~75 characters (~300-400 tokens as the sim counts them). Each turn brings its own, so
    a conversation's history, not the system prompt, is most of a later turn's prompt:
    the part of the prompt that only the worker that served the last turn holds."""
    lines = []
    for _ in range(rng.randint(12, 16)):
        h, m, sec = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
        event, state = rng.choice(_LOG_EVENTS), rng.choice(_LOG_STATES)
        lines.append(
            f"{h:02d}:{m:02d}:{sec:02d} player={rng.randint(1000, 99999)} event={event} "
            f"item={rng.choice(_THINGS)} amount={rng.randint(1, 5000)} status={state}"
        )
    return "\n".join(lines)


def _question(rng: random.Random, number: int) -> str:
    ask = rng.choice(_ASKS).format(
        verb=rng.choice(_VERBS), thing=rng.choice(_THINGS), place=rng.choice(_PLACES),
        event=rng.choice(_EVENTS),
    )  # fmt: skip
    player = rng.randint(1000, 99999)
    return f"{ask} (player {player}, ticket {number})\nTheir log:\n{_log_excerpt(rng)}"


@dataclass(frozen=True)
class ChatTurn:
    """Turn `turn` of a conversation (or the only one of a one-shot request)."""

    tenant: str
    thread: str  # `<tenant>-c<n>` for a conversation, `<tenant>-o<n>` for a one-shot
    turn: int
    system: str
    questions: tuple[str, ...]  # this turn's question last
    answers: tuple[str, ...]  # one per earlier turn
    max_tokens: int

    @property
    def index(self) -> int:
        return self.turn

    def _messages(self) -> list[tuple[Literal["system", "user", "assistant"], str]]:
        out: list[tuple[Literal["system", "user", "assistant"], str]] = [("system", self.system)]
        for question, answer in zip(self.questions, (*self.answers, None), strict=True):
            out.append(("user", question))
            if answer is not None:
                out.append(("assistant", answer))
        return out

    def openai_body(self, model: str, *, stream: bool) -> dict[str, Any]:
        messages = [{"role": r, "content": c} for r, c in self._messages()]
        return _openai(model, messages, self.max_tokens, stream)

    def headers(self) -> dict[str, str]:
        return {}  # no session: routers see only the prompt

    def generate_request(
        self, pool: str, deadline: float, *, stream: bool = True
    ) -> GenerateRequest:
        messages = [ChatMessage(role=r, content=c) for r, c in self._messages()]
        return GenerateRequest(
            tenant=self.tenant, workload="llm", pool=pool, session=None, messages=messages,
            sampling=Sampling(max_tokens=self.max_tokens, temperature=0.0),
            prompt_tokens=estimate_tokens(messages), deadline=deadline, stream=stream,
        )  # fmt: skip


@dataclass(frozen=True)
class ChatJob:
    """A conversation or a one-shot request: its turns are sent one after the other."""

    tenant: str
    thread: str
    system: str
    questions: tuple[str, ...]
    max_tokens: tuple[int, ...]

    def turn(self, k: int, answers: tuple[str, ...]) -> ChatTurn:
        return ChatTurn(
            self.tenant, self.thread, k, self.system, self.questions[: k + 1], answers,
            self.max_tokens[k],
        )  # fmt: skip


def _counts(total: int, shares: list[float]) -> list[int]:
    """`total` split by `shares` with largest remainders, so the counts add up exactly."""
    exact = [total * s for s in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def chat_jobs(cfg: ChatConfig) -> list[ChatJob]:
    """Every job of the chat workload, in the (seeded, shuffled) order lanes take them."""
    if cfg.tenants < 1 or cfg.turns < 1:
        raise ValueError("the chat workload needs at least one tenant and one turn")
    shares = cfg.shares()
    tenants = [f"t{i}" for i in range(cfg.tenants)]
    jobs: list[ChatJob] = []
    for kind, total, turns in (("c", cfg.conversations, cfg.turns), ("o", cfg.one_shots, 1)):
        for t, count in enumerate(_counts(total, shares)):
            system = tenant_system_prompt(cfg.seed, t)
            for n in range(count):
                rng = _rng("job", cfg.seed, t, kind, n)
                jobs.append(
                    ChatJob(
                        tenants[t], f"{tenants[t]}-{kind}{n}", system,
                        tuple(_question(rng, k) for k in range(turns)),
                        tuple(rng.choice(CHAT_MAX_TOKENS) for _ in range(turns)),
                    )
                )  # fmt: skip
    _rng("order", cfg.seed).shuffle(jobs)
    return jobs


# -- driving a workload ----------------------------------------------------------------

Send = Callable[[BenchRequest], Awaitable[Outcome]]
NO_ANSWER = "(no answer)"  # what joins the history when a request failed


@dataclass(frozen=True)
class Sent:
    request: BenchRequest
    outcome: Outcome | None  # None: it failed, `error` says why
    error: str | None = None


@dataclass
class Run:
    sent: list[Sent] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def done(self) -> list[tuple[BenchRequest, Outcome]]:
        return [(s.request, s.outcome) for s in self.sent if s.outcome is not None]

    @property
    def errors(self) -> list[str]:
        return [s.error or "" for s in self.sent if s.outcome is None]

    def prefix_hit_rate(self, after_first: bool = False) -> float:
        """Cached / prompt tokens of the completed requests (`after_first`: of those after
        their thread's first)."""
        outcomes = [o for r, o in self.done if r.index > 0 or not after_first]
        prompt = sum(o.prompt_tokens for o in outcomes)
        return sum(o.cached_tokens for o in outcomes) / prompt if prompt else 0.0

    def per_worker(self, workers: Sequence[str]) -> tuple[list[int], list[float]]:
        """Requests each of `workers` completed, and the modelled GPU time they used there
        (`ModelledTimings.gpu`: its share of the steps it ran in, not time spent waiting)."""
        count = Counter(o.worker for _, o in self.done)
        busy: defaultdict[str | None, float] = defaultdict(float)
        for _, o in self.done:
            if o.modelled is not None:
                busy[o.worker] += o.modelled.gpu
        return [count.get(w, 0) for w in workers], [busy.get(w, 0.0) for w in workers]


async def _send(send: Send, request: BenchRequest, run: Run) -> str:
    """Send one request, record it; the answer's text (or `NO_ANSWER`) for the history."""
    try:
        outcome = await send(request)
    except Exception as e:  # counted and reported; the thread goes on, as a client would
        run.sent.append(Sent(request, None, f"{type(e).__name__}: {e}"[:300]))
        return NO_ANSWER
    run.sent.append(Sent(request, outcome))
    return outcome.text


# Seconds a phone spends acting on an answer before its next step (its action plays out,
# the screen settles): the load 200 phones offer 8 A100s at 720p (`pair` prompts, ~2,100
# tokens to prefill a step, ~0.23 s of GPU) is then ~2/3 of their prefill rate (~9k
# tokens/s each). Back to back (0) they would ask for ~4x what the GPUs can prefill.
AGENT_ACT_S = 8.0


async def run_agent(
    sessions: int, steps: int, seed: int, send: Send, act_s: float = 0.0, scale: float = 1.0
) -> Run:
    """Every episode at once, each a loop over its steps, acting after each answer for
    0.5-1.5 x `act_s` modelled seconds (x `scale` wall), drawn per episode from `seed`;
    the first steps are spread over one `act_s`, as phones that started apart are. The
    spread matters: phones that act for exactly as long as each other, on one worker,
    fall into step (a burst that queued together finishes together, and its phones come
    back together), a lockstep no real game keeps."""
    run = Run()

    async def episode(session: int) -> None:
        rng = random.Random(f"{seed}:act:{session}")
        history: list[str] = []
        await asyncio.sleep(act_s * scale * session / max(1, sessions))
        for step in range(steps):
            history.append(await _send(send, AgentStep(seed, session, step, tuple(history)), run))
            if step + 1 < steps and act_s > 0:
                await asyncio.sleep(act_s * scale * rng.uniform(0.5, 1.5))

    started = time.perf_counter()
    await asyncio.gather(*(episode(s) for s in range(sessions)))
    run.wall_s = time.perf_counter() - started
    return run


async def run_chat(cfg: ChatConfig, send: Send) -> Run:
    """`cfg.concurrency` lanes, each taking the next job when its last one is done."""
    run = Run()
    jobs = iter(chat_jobs(cfg))

    async def lane() -> None:
        for job in jobs:  # one shared iterator: no job runs twice
            answers: list[str] = []
            for k in range(len(job.questions)):
                answers.append(await _send(send, job.turn(k, tuple(answers)), run))

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(cfg.concurrency)))
    run.wall_s = time.perf_counter() - started
    return run
