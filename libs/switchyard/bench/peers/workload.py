"""The requests of both runs, built once and sent to every column the same way.

- Overhead: short chat prompts, a few output tokens, no constraint.
- Routing: the workloads of `sy bench route` (`switchyard.bench.routeload`): the agent's
  episodes (session in `X-Session-ID` and `user` over HTTP, in the envelope's `session`
  over NATS) and the chat tenants' conversations and one-shot requests (no session
  anywhere: each router sees only the prompt).
"""

from __future__ import annotations

from switchyard.bench.routeload import ACTION_SCHEMA, AgentStep, ChatTurn

__all__ = ["ACTION_SCHEMA", "OVERHEAD_PROMPTS", "AgentStep", "ChatTurn", "overhead_messages"]

OVERHEAD_PROMPTS = (
    "Describe the main menu of a mobile strategy game.",
    "List five things a player can do in a farming game.",
    "Explain how a daily login reward works.",
    "Write a short note about a server maintenance window.",
)


def overhead_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{OVERHEAD_PROMPTS[i % len(OVERHEAD_PROMPTS)]} (#{i})"}]
