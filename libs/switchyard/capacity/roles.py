"""Which role split to run an agent pool with (#39): `sy plan --roles auto`.

Each agent step costs its prefill worker one frame's GPU time (`frame_seconds`: the
encoder pass and the prefill of its tokens) and its decode worker the answer's tokens,
one engine step each, shared by the decode batch. A split of `gpus` cards into `p`
prefill and `d` decode workers serves at most

    prefill: p / frame_s        decode: d x B / (tokens x step(B))   steps/s

at 100 % busy, where `B` is the largest batch whose step keeps the answer within the
step SLO once the frame is prefilled (`slo - fixed - frame_s >= tokens x step(B)`,
`step(B)` = `sim_decode_seconds`) and whose sequences' KV fits the card, and a colocated
pool `gpus / (frame_s + tokens x step(B) / B)`. The recommended split is the one whose
smaller ceiling is largest: the two pools as evenly loaded as whole GPUs allow. These
are ceilings, not capacities: a step's p99 holds only far below 100 % busy (the README's
searches: 13-32 % of the prefill ceiling), which `sy agent-sim --engine sim --search
--roles auto` measures; the ratio of the two ceilings is what picks the split, and the
search checks it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from switchyard.capacity.calibration import SimCalibration, frame_seconds, sim_decode_seconds
from switchyard.capacity.errors import CapacityInputError

Limit = Literal["prefill", "decode", "both"]
MAX_BATCH = 256  # the engine's max_num_seqs: no batch beyond it
DEFAULT_STEP_SLO_MS = 500.0  # the agent step's SLO (the mission's < 500 ms on a GPU)
# Tokens of one answer when none is given: a click in the compact format, the agent's
# default (9 with Qwen's tokenizer: README, "fewer decode steps per action"; a swipe 22).
ANSWER_TOKENS = 9


@dataclass(frozen=True)
class SplitCeiling:
    prefill_workers: int  # colocated: every GPU, as `both` workers
    decode_workers: int  # 0: colocated
    batch: int  # the decode batch whose step keeps the answer within the SLO
    steps_per_s: float  # what the split serves at 100 % busy: its smaller ceiling
    prefill_steps_per_s: float  # the prefill (or colocated) workers' ceiling
    decode_steps_per_s: float  # the decode workers' (colocated: the same as above)
    limit: Limit

    @property
    def roles(self) -> str:
        """`7p1d`, or `8b` colocated: `fleet.spec.role_split`'s spelling."""
        if self.decode_workers == 0:
            return f"{self.prefill_workers}b"
        return f"{self.prefill_workers}p{self.decode_workers}d"

    def as_dict(self) -> dict[str, Any]:
        return {"roles": self.roles, **asdict(self)}


def decode_batch(cal: SimCalibration, tokens: int, budget_s: float, most: int) -> int:
    """The largest batch (up to `most`) whose `tokens` decode steps fit in `budget_s`; 0
    when even one sequence's do not."""
    per_seq = cal.tpot_per_seq
    room = budget_s / tokens - sim_decode_seconds(cal, 0)
    if room < per_seq:
        return 0
    return min(most, int(room / per_seq)) if per_seq > 0 else most


def split_ceilings(
    cal: SimCalibration, gpus: int, tokens: int, slo_s: float, fixed_s: float, context: int
) -> list[SplitCeiling]:
    """The colocated pool and every split of `gpus` with at least one of each role;
    `context`: the KV tokens each decoding sequence holds (the card's KV caps the batch)."""
    if gpus < 1 or tokens < 1 or context < 1:
        raise CapacityInputError("a role split needs at least 1 GPU, 1 answer token, 1 of KV")
    frame = frame_seconds(cal)
    budget = slo_s - fixed_s - frame
    most = min(MAX_BATCH, cal.kv_capacity_tokens // context)
    batch = decode_batch(cal, tokens, budget, most) if budget > 0 else 0
    if batch == 0:
        raise CapacityInputError(
            f"no decode batch meets a {slo_s * 1000:g} ms step: the frame's prefill takes "
            f"{frame * 1000:.0f} ms, the fixed part {fixed_s * 1000:g} ms, and {tokens} tokens "
            f"at batch 1 {tokens * sim_decode_seconds(cal, 1) * 1000:.0f} ms; or the KV of "
            f"{cal.kv_capacity_tokens:,} tokens holds no {context:,}-token sequence"
        )
    per_decode = batch / (tokens * sim_decode_seconds(cal, batch))  # steps/s of one card
    colocated = gpus / (frame + 1 / per_decode)
    out = [SplitCeiling(gpus, 0, batch, colocated, colocated, colocated, "both")]
    for d in range(1, gpus):
        p = gpus - d
        pre, dec = p / frame, d * per_decode
        limit: Limit = "prefill" if pre < dec else "decode"
        out.append(SplitCeiling(p, d, batch, min(pre, dec), pre, dec, limit))
    return out


def best_split(ceilings: list[SplitCeiling]) -> SplitCeiling:
    """The split of the most steps/s at 100 % busy (the fewest decode workers on a tie:
    prefill is what a step's latency waits on)."""
    splits = [c for c in ceilings if c.decode_workers > 0] or ceilings
    return max(splits, key=lambda c: (round(c.steps_per_s, 9), -c.decode_workers))


@dataclass(frozen=True)
class RolePlan:
    ceilings: list[SplitCeiling]
    best: SplitCeiling

    def as_dict(self) -> dict[str, Any]:
        return {"recommended": self.best.roles, "splits": [c.as_dict() for c in self.ceilings]}
