"""`sy plan --roles`: the ceilings of an agent pool's role splits and the one to run (#39)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from switchyard.capacity.calibration import frame_seconds, sim_calibration, sim_decode_seconds
from switchyard.capacity.errors import CapacityInputError
from switchyard.capacity.roles import best_split, decode_batch, split_ceilings
from switchyard.cli.app import app

CAL = sim_calibration("rtx5090", "qwen3-vl-8b", "fp8")


def test_the_decode_batch_is_the_largest_whose_answer_fits_the_budget() -> None:
    for tokens, budget in ((9, 0.3), (33, 0.3), (22, 0.25)):
        b = decode_batch(CAL, tokens, budget, most=10_000)
        assert b >= 1
        assert tokens * sim_decode_seconds(CAL, b) <= budget
        assert tokens * sim_decode_seconds(CAL, b + 1) > budget
    assert decode_batch(CAL, 9, 0.3, most=4) == 4  # the card's KV (or max_num_seqs) caps it
    assert decode_batch(CAL, 100, 0.1, most=10_000) == 0  # 100 tokens never fit in 100 ms


def test_each_split_is_bounded_by_its_prefill_and_its_decode_workers() -> None:
    tokens, slo, fixed, context = 9, 0.5, 0.03, 8192
    ceilings = split_ceilings(CAL, 8, tokens, slo, fixed, context)
    assert [c.roles for c in ceilings] == ["8b", *(f"{8 - d}p{d}d" for d in range(1, 8))]
    frame = frame_seconds(CAL)
    batch = ceilings[0].batch
    assert batch == min(CAL.kv_capacity_tokens // context,
                        decode_batch(CAL, tokens, slo - fixed - frame, 256))  # fmt: skip
    per_decode = batch / (tokens * sim_decode_seconds(CAL, batch))
    for c in ceilings[1:]:
        assert c.prefill_steps_per_s == pytest.approx(c.prefill_workers / frame)
        assert c.decode_steps_per_s == pytest.approx(c.decode_workers * per_decode)
        assert c.steps_per_s == min(c.prefill_steps_per_s, c.decode_steps_per_s)
    # Colocated, every card does both: at 100 % busy it strands nothing, so its ceiling is
    # the highest; a split pays ceiling for frames that never stall another phone's decode.
    assert ceilings[0].steps_per_s == pytest.approx(8 / (frame + 1 / per_decode))
    assert ceilings[0].steps_per_s > max(c.steps_per_s for c in ceilings[1:])


def test_the_recommended_split_is_the_measured_best_at_chunk_1() -> None:
    """README "GPUs pooled by role": the sim's search at chunk 1 (RTX 5090 FP8) found 7p1d
    (13 phones; 6p2d the same, 8b 10); a one-click answer leaves the decode card far from
    full, so every GPU but one prefills."""
    best = best_split(split_ceilings(CAL, 8, 9, 0.5, 0.03, 8192))
    assert (best.roles, best.limit) == ("7p1d", "prefill")
    # Long answers in a tight SLO shrink the decode batch until decode cards must be added.
    long = best_split(split_ceilings(CAL, 8, 33, 0.5, 0.03, 8192))
    assert long.decode_workers >= 2 and long.limit == "prefill"


def test_a_step_slo_no_batch_meets_is_refused() -> None:
    with pytest.raises(CapacityInputError, match="no decode batch meets a 200 ms step"):
        split_ceilings(CAL, 8, 9, 0.2, 0.03, 8192)
    with pytest.raises(CapacityInputError, match="holds no"):
        split_ceilings(CAL, 8, 9, 0.5, 0.03, CAL.kv_capacity_tokens + 1)


def test_sy_plan_recommends_a_split_and_refuses_a_wrong_one() -> None:
    base = ["plan", "--model", "qwen3-vl-8b", "--gpu", "rtx-5090", "--precision", "fp8"]
    out = CliRunner().invoke(app, [*base, "--roles", "auto", "--json"])
    assert out.exit_code == 0, out.output
    roles = json.loads(out.stdout)["roles"]
    assert roles["recommended"] == "7p1d" and len(roles["splits"]) == 8
    one = CliRunner().invoke(app, [*base, "--roles", "6p2d", "--json"])
    assert [s["roles"] for s in json.loads(one.stdout)["roles"]["splits"]] == ["8b", "6p2d"]
    table = CliRunner().invoke(app, [*base, "--roles", "auto"])
    assert table.exit_code == 0 and "recommended" in table.stdout
    for bad, why in (
        (["--roles", "6p1d"], "names 7 workers"),
        (["--roles", "6x2"], "--roles"),
        (["--roles", "auto", "--step-slo-ms", "150"], "no decode batch"),
    ):
        refused = CliRunner().invoke(app, [*base, *bad])
        assert refused.exit_code == 2 and why in refused.output, refused.output
    other = CliRunner().invoke(app, ["plan", "--model", "qwen2.5-7b", "--gpu", "l40s",
                                     "--roles", "auto"])  # fmt: skip
    assert other.exit_code == 2 and "the sim's calibrations" in other.output
