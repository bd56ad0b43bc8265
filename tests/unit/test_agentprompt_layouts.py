"""Agent prompt layouts on the sim engine's token sequence (what its prefix cache sees).

Each test renders consecutive steps of one episode with `render_prompt` and
checks what a step shares with the one before: `window` everything but the
previous query between compactions and system + goal after one, `single` and
`pair` the system prompt and the history.
"""

from __future__ import annotations

import pytest

import switchyard.agentprompt as agentprompt
from services.preprocessor.layout import (
    LayoutChoice,
    estimate_prompt_tokens,
    estimate_window_tokens,
)
from services.preprocessor.settings import PreprocessorSettings
from switchyard.agentactions import ANSWER_INSTRUCTIONS
from switchyard.agentprompt import (
    LAYOUTS,
    MAX_WINDOW,
    SYSTEM_PROMPTS,
    AgentLayout,
    build_messages,
    fit,
    system_prompt,
    window_start,
)
from switchyard.bench.agentsim import AgentSimConfig, _PrefixModel
from switchyard.bench.layoutcost import frame_image, frame_steps, layout_cost, sample_actions, table
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import pseudo_tokens, render_prompt
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import Image, ImagePart, TextPart

SIZE = fit(1280, 720, 1280 * 720)
ACTIONS = sample_actions(40)
GOAL = "collect the daily reward"


def _step(k: int, history: list[str] | None = None) -> AgentStep:
    return AgentStep(
        tenant="t", session="e1", frame_ts=0.0, step=k, goal=GOAL,
        history=ACTIONS[:k] if history is None else history, frames=[RawFrame(data=b"x")],
    )  # fmt: skip


def _frames(layout: AgentLayout, k: int, window: int) -> list[Image]:
    return [frame_image("e1", s, SIZE) for s in frame_steps(layout, k, window)]


def _tokens(
    layout: AgentLayout, k: int, window: int = 4, step: AgentStep | None = None
) -> list[str]:
    frames = _frames(layout, k, window)
    messages = build_messages(step or _step(k), frames, layout)
    req = EngineRequest(request_id=f"r{k}", messages=tuple(messages), images=tuple(frames))
    return render_prompt(req, SimSettings())


def _shared(a: list[str], b: list[str]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _query_at(tokens: list[str], k: int) -> int:
    """Where step k's trailing query starts in its own prompt."""
    query = pseudo_tokens(f"Step {k}: next action?")
    for i in range(len(tokens) - len(query), -1, -1):
        if tokens[i : i + len(query)] == query:
            return i
    raise AssertionError("no query")


def _frame_tokens(k: int) -> int:
    return sum(1 for t in _tokens("single", k) if t.startswith("<img:"))


def _system_and_goal_end(tokens: list[str]) -> int:
    """The index just after "Actions so far:" (system prompt and goal before it)."""
    marker = pseudo_tokens("\nActions so far:\n")
    for i in range(len(tokens)):
        if tokens[i : i + len(marker)] == marker:
            return i + len(marker)
    raise AssertionError("no history header")


@pytest.mark.parametrize("window", [2, 4, 8])
def test_window_shares_the_previous_prompt_but_its_query_between_compactions(window: int) -> None:
    for k in range(1, 3 * window + 1):
        prev, cur = _tokens("window", k - 1, window), _tokens("window", k, window)
        shared = _shared(prev, cur)
        if k % window:
            # Everything before the previous step's query is reused: system, goal, the
            # history, every frame of the window and its actions so far.
            assert shared == _query_at(prev, k - 1), k
            new = cur[shared:]
            # What is new: the last action as text, the new frame, the query.
            assert sum(1 for t in new if t.startswith("<img:")) == _frame_tokens(k)
            assert all(
                f"<img:{frame_image('e1', s, SIZE).hash}:0>" in cur
                for s in range(k - k % window, k + 1)
            )
            assert len(new) - _frame_tokens(k) < 60, new
        else:
            # A compaction: the old frames leave, their actions join the text history;
            # the system prompt and the goal (and older actions) are still a prefix.
            assert shared >= _system_and_goal_end(cur), k
            assert not any(t.startswith("<img:") for t in cur[:shared])
            assert sum(1 for t in cur if t == "<|vision_start|>") == 1
            for s in range(k):
                assert f"{s}: {ACTIONS[s]}" in "".join(cur)


def test_window_after_a_second_compaction_shares_the_actions_before_the_first() -> None:
    w = 4
    prev, cur = _tokens("window", 2 * w - 1, w), _tokens("window", 2 * w, w)
    line = pseudo_tokens(f"{w - 1}: {ACTIONS[w - 1]}\n")
    end_of_old_history = _system_and_goal_end(prev) + len(pseudo_tokens(
        "\n".join(f"{s}: {a}" for s, a in enumerate(ACTIONS[:w])) + "\n"
    ))  # fmt: skip
    assert prev[end_of_old_history - len(line) : end_of_old_history] == line
    assert _shared(prev, cur) >= end_of_old_history - 1


@pytest.mark.parametrize("layout", ["single", "pair"])
def test_single_and_pair_share_system_and_history(layout: AgentLayout) -> None:
    for k in range(1, 10):
        prev, cur = _tokens(layout, k - 1), _tokens(layout, k)
        shared = _shared(prev, cur)
        history_end = prev.index("<|vision_start|>")
        # Up to the end of the previous history ("(none yet)" at step 0 gives way).
        assert shared >= (history_end - 2 if k > 1 else _system_and_goal_end(prev)), k
        # Never a frame: the current frame is new, and pair's previous frame follows a
        # longer history, so its position moved.
        assert not any(t.startswith("<img:") for t in cur[:shared])
    assert _tokens("pair", 3).count("<|vision_start|>") == 2
    assert _tokens("single", 3).count("<|vision_start|>") == 1


def test_layouts_have_their_own_system_prompt_and_pair_keeps_the_old_one() -> None:
    assert SYSTEM_PROMPTS["pair"] == agentprompt.SYSTEM_PROMPT
    assert "previous and the current screenshot" in SYSTEM_PROMPTS["pair"]
    assert len(set(SYSTEM_PROMPTS.values())) == 3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_system_prompt_asks_for_the_steps_answer_format(layout: AgentLayout) -> None:
    frames = _frames(layout, 2, 4)
    for fmt in ("json", "compact"):
        step = _step(2).model_copy(update={"options": StepOptions(action_format=fmt)})
        system = build_messages(step, frames, layout)[0].content
        assert system == system_prompt(layout, fmt)
        assert ANSWER_INSTRUCTIONS[fmt] in system
    assert build_messages(_step(2), frames, layout)[0].content == SYSTEM_PROMPTS[layout]
    assert "one per line" in system_prompt(layout, "compact")
    assert "JSON" not in system_prompt(layout, "compact")


def test_window_start_compacts_every_w_and_restarts_when_lost() -> None:
    starts, start = [], None
    for k in range(10):
        start = window_start(start, k, 4)
        starts.append(start)
    assert starts == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]
    assert window_start(None, 7, 4) == 7  # nothing known: restart here
    assert window_start(9, 7, 4) == 7  # a start after the previous step is not this episode's
    assert window_start(4, 6, 4) == 4
    assert window_start(4, 8, 4) == 8
    assert window_start(0, 5, 1) == 5  # W = 1: every step compacts


def test_window_actions_follow_the_history_tail_the_client_sent() -> None:
    # A client that sends only the last three actions: aligned by step, not by index.
    step = _step(6, history=ACTIONS[3:6])
    frames = _frames("window", 6, 8)  # steps 0..6
    parts = build_messages(step, frames, "window")[1].content
    assert isinstance(parts, list)
    texts = [p.text for p in parts if isinstance(p, TextPart)]
    assert texts[0].endswith("Actions so far:\n(none yet)\n")
    assert texts[1:4] == ["0: (not reported)\n", "1: (not reported)\n", "2: (not reported)\n"]
    assert texts[4:7] == [f"{s}: {ACTIONS[s]}\n" for s in (3, 4, 5)]
    assert [p.hash for p in parts if isinstance(p, ImagePart)] == [f.hash for f in frames]


def test_layouts_refuse_frames_they_cannot_lay_out() -> None:
    two = _frames("pair", 3, 4)
    with pytest.raises(ValueError, match="current frame only"):
        build_messages(_step(3), two, "single")
    many = [frame_image("e1", s, SIZE) for s in range(MAX_WINDOW + 1)]
    with pytest.raises(ValueError, match="at most"):
        build_messages(_step(MAX_WINDOW), many, "window")
    with pytest.raises(ValueError, match="cannot have a window"):
        build_messages(_step(1), _frames("window", 3, 4), "window")  # 4 frames before step 1


def test_prompt_token_estimate_follows_the_layout() -> None:
    est = {}
    for layout in LAYOUTS:
        frames = _frames(layout, 6, 8)
        est[layout] = estimate_prompt_tokens(build_messages(_step(6), frames, layout), frames)
    frame = 40 * 22 + 2  # a 1280x704 frame in the default profile's 32-px tokens
    assert est["single"] < est["pair"] < est["window"]
    assert est["pair"] - est["single"] == pytest.approx(frame, abs=10)
    assert est["window"] - est["single"] == pytest.approx(6 * frame, abs=60)
    # And it stays close to what the sim engine will count.
    for layout in LAYOUTS:
        sim = len(_tokens(layout, 6, 8))
        assert abs(est[layout] - sim) < 0.1 * sim, layout


def test_the_docstring_table_is_what_the_layouts_measure() -> None:
    assert agentprompt.__doc__ is not None
    assert table() in agentprompt.__doc__


def test_window_costs_one_frame_of_prefill_and_holds_more_context() -> None:
    pair, single, w4 = layout_cost("pair"), layout_cost("single"), layout_cost("window", 4)
    frame = _frame_tokens(1)
    assert pair.mean_prefill() > 2 * frame > single.mean_prefill() > frame
    assert abs(w4.mean_prefill() - single.mean_prefill()) < 0.1 * frame
    assert w4.hit_rate() > single.hit_rate() > pair.hit_rate()
    assert 4 * frame < max(w4.prompt_tokens) < 5 * frame  # never more than W frames


def test_agent_sim_prefix_model_follows_the_layout() -> None:
    cfg = AgentSimConfig(width=1280, height=720)
    sent = [RawFrame(data=b"p"), RawFrame(data=b"c")]
    for layout in LAYOUTS:
        model = _PrefixModel(cfg, layout, window=4)
        steps = [_step(k).model_copy(update={"frames": sent if k else sent[1:]}) for k in range(6)]
        toks = [model.tokens(s, phone=0) for s in steps]
        frames = [t.count("<|vision_start|>") for t in toks]
        assert frames == {"pair": [1, 2, 2, 2, 2, 2], "single": [1] * 6,
                          "window": [1, 2, 3, 4, 1, 2]}[layout], layout  # fmt: skip


def test_settings_refuse_a_window_that_cannot_fit_a_message() -> None:
    assert PreprocessorSettings(agent_layout="window", agent_window=8).agent_window == 8
    with pytest.raises(ValueError, match="at most 8 frames fit"):
        PreprocessorSettings(agent_layout="window", agent_window=9)
    # A tenant's own window is checked too; a pair pool's W is not used and not checked.
    with pytest.raises(ValueError, match="tenant acme"):
        PreprocessorSettings(agent_tenant_layouts={"acme": {"layout": "window", "window": 12}})
    s = PreprocessorSettings(
        agent_window=12, max_pixels=640 * 360,
        agent_tenant_layouts={"acme": {"layout": "window"}, "bob": {"layout": "single"}},
    )  # fmt: skip
    assert (s.layout_for("acme").layout, s.layout_for("acme").window) == ("window", 12)
    assert s.layout_for("bob").layout == "single" and s.layout_for("zed").layout == "window"
    assert s.window_problem(1_000_000) is not None  # a smaller server limit is caught at start


def test_layouts_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_AGENT_LAYOUT", "single")
    monkeypatch.setenv("SY_AGENT_TENANT_LAYOUTS", '{"acme": {"layout": "window", "window": 4}}')
    s = PreprocessorSettings()
    assert s.layout_for("acme").layout == "window" and s.layout_for("acme").window == 4
    assert s.layout_for("other").layout == "single"
    monkeypatch.setenv("SY_AGENT_TENANT_LAYOUTS", '{"acme": {"layout": "grid"}}')
    with pytest.raises(ValueError, match="layout"):
        PreprocessorSettings()


@pytest.mark.parametrize(("layout", "window"), [("pair", 8), ("single", 8), ("window", 4)])
def test_a_first_steps_window_estimate_is_what_its_episode_keeps_cached(
    layout: AgentLayout, window: int
) -> None:
    """From its first step (one frame), the KV its episode keeps cached once the layout
    holds all its frames: within 5 % of that step's prompt as the sim counts it
    (`layoutcost`). Left out: the history's later growth, a line per step (~22 tokens)."""
    frames = _frames(layout, 0, window)
    first = estimate_prompt_tokens(build_messages(_step(0), frames, layout), frames)
    choice = LayoutChoice(layout, window)
    estimate = estimate_window_tokens(first, frames, choice, 0)
    full = layout_cost(layout, window).prompt_tokens[choice.frames - 1]
    assert abs(estimate - full) < 0.05 * full, (estimate, full)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pending_actions_sit_in_the_query_where_no_later_prefix_reaches(
    layout: AgentLayout,
) -> None:
    k = 5
    plain = _tokens(layout, k)
    still = _step(k).model_copy(update={"pending": ["swipe 500 800 500 200 300", "back"]})
    pending = _tokens(layout, k, step=still)
    query = _query_at(plain, k)
    # Everything before the query is unchanged: the cache serves the pending step as well.
    assert pending[:query] == plain[:query]
    text = agentprompt.pending_text(still.pending)
    assert text == "Still executing: swipe 500 800 500 200 300; back\n"
    assert pending[query:] == pseudo_tokens(text) + plain[query:]
    # And step k + 1, which does not carry it, shares the same prefix as without it.
    assert _shared(_tokens(layout, k + 1), pending) == _shared(_tokens(layout, k + 1), plain)
    assert agentprompt.pending_text([]) == ""
