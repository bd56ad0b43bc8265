"""Agent answer formats (`switchyard.agentactions`): the grammar, its regex, the parser and
the encoder agree with each other and with the pydantic action models; the sim writes
valid answers (the worker's output step, cut answers and mapping: test_worker_output.py)."""

from __future__ import annotations

import json
import math
import random
import re

import jsonschema  # type: ignore[import-untyped]
import pytest

from services.worker.output import Cut, agent_answer
from switchyard.agentactions import (
    ACTION_FORMATS,
    COORD,
    GRID_DURATIONS_MS,
    MAX_TYPED_CHARS,
    PRESS_MS,
    SWIPE_MS,
    WAIT_MS,
    ActionFormatError,
    Answer,
    answer_regex,
    answer_token_budget,
    encode_answer,
    is_wrapped,
    longest_answers,
    parse_actions,
    parse_answer_text,
)
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimEngine, SimSettings
from switchyard.engines.sim_output import ACTION_KINDS, sim_action, sim_answer
from switchyard.engines.sim_tokens import pseudo_tokens
from switchyard.messages.agent import (
    MAX_CHUNK,
    ActionAnswer,
    ActionFormat,
    Back,
    ChunkAnswer,
    Click,
    Done,
    LongPress,
    Swipe,
    TypeText,
    Wait,
    answer_schema,
)
from switchyard.messages.inference import ActionsConstraint, ChatMessage, Image, Sampling
from switchyard.vlmgeometry import RELATIVE_SCALE

SHAPES = [(f, k, t) for f in ACTION_FORMATS for k in range(1, MAX_CHUNK + 1) for t in (False, True)]


def sim_answers(n: int, seed: int = 1) -> list[tuple[ActionFormat, int, bool, str]]:
    """`n` sim answers of every (format, chunk, thought), on a 1260x700 frame (720p fitted)."""
    rng = random.Random(seed)
    frame = Image(hash="ab" * 16, data=b"x", mime="image/jpeg", width=1260, height=700)
    req = EngineRequest(request_id="r", images=(frame,))
    return [
        (f, k, t, sim_answer(ActionsConstraint(action_format=f, chunk=k, thought=t), req, rng))
        for f, k, t in SHAPES
        for _ in range(n)
    ]


# -- round trips ---------------------------------------------------------------------


EXACT: tuple[ActionFormat, ...] = ("json", "compact")  # the formats that hold any action


@pytest.mark.parametrize("fmt", EXACT)
def test_every_action_round_trips_and_matches_the_grammar(fmt: ActionFormat) -> None:
    rng = random.Random(3)
    for kind in ACTION_KINDS:
        for _ in range(50):
            action = sim_action(kind, 1260, 700, rng)
            text = encode_answer(Answer((action,)), fmt)
            assert parse_answer_text(text, fmt) == Answer((action,))
            assert encode_answer(parse_answer_text(text, fmt), fmt) == text
            assert re.fullmatch(answer_regex(fmt), text), text


def test_sim_answers_parse_match_the_regex_and_fill_the_chunk() -> None:
    for fmt, k, thought, text in sim_answers(20):
        answer = parse_answer_text(text, fmt, chunk=k, thought=thought)
        assert len(answer.actions) == k
        assert (answer.thought is not None) == thought
        assert re.fullmatch(answer_regex(fmt, k, thought), text), text
        w, h = (1260, 700) if fmt != "grid" else (RELATIVE_SCALE, RELATIVE_SCALE)  # 0..999
        for a in answer.actions:
            d = a.model_dump()
            for kx, ky in (("x", "y"), ("x1", "y1"), ("x2", "y2")):
                if kx in d:
                    assert 0 <= d[kx] < w and 0 <= d[ky] < h
        wrapped = is_wrapped(k, thought)
        assert encode_answer(answer, fmt, wrapped=wrapped) == text
        if fmt == "json":  # the JSON contract: pydantic parse and the published schema agree
            parsed = (ChunkAnswer.model_validate_json(text).actions if wrapped
                      else [ActionAnswer.model_validate_json(text).root])  # fmt: skip
            assert parsed == list(answer.actions)
            jsonschema.validate(json.loads(text), answer_schema(k, thought))


def test_compact_examples() -> None:
    text = "# close the pop-up\nclick 520 1180\nlong_press 10 20 800\nswipe 100 900 100 300 250"
    answer = parse_answer_text(text + "\ntype hello world\nwait 500", "compact")
    assert answer.thought == "close the pop-up"
    assert answer.actions == (
        Click(x=520, y=1180),
        LongPress(x=10, y=20, ms=800),
        Swipe(x1=100, y1=900, x2=100, y2=300, ms=250),
        TypeText(text="hello world"),
        Wait(ms=500),
    )
    assert parse_actions("back", "compact") == [Back()]
    assert parse_actions("done", "compact")[0].type == "done"
    assert encode_answer(Answer((Click(x=0, y=16384),)), "compact") == "click 0 16384"


def test_every_grid_action_round_trips_on_the_grid_and_matches_the_grammar() -> None:
    """Any action (points on the 0..1000 scale) -> its grid text, which parses to the action
    rounded to the grid and encodes again to itself; every digit of every field."""
    rng = random.Random(4)
    for kind in ACTION_KINDS:
        for _ in range(200):
            action = sim_action(kind, RELATIVE_SCALE + 1, RELATIVE_SCALE + 1, rng)
            if isinstance(action, LongPress | Swipe | Wait):
                action = action.model_copy(update={"ms": rng.randint(1, 10_000)})
            text = encode_answer(Answer((action,)), "grid")
            assert re.fullmatch(answer_regex("grid"), text), text
            parsed = parse_answer_text(text, "grid")
            assert encode_answer(parsed, "grid") == text
            (back,) = parsed.actions
            assert back.type == action.type
            d, e = back.model_dump(), action.model_dump()
            for f, v in e.items():
                if f in ("x", "y"):  # three digits: the point itself (1000 is 999)
                    assert d[f] == min(v, 999)
                elif f in ("x1", "y1", "x2", "y2"):  # two: its 1 % cell's centre
                    assert d[f] == v // 10 * 10 + 5 if v < 1000 else d[f] == 995
                elif f == "ms":  # the nearest duration of the table, on a log scale
                    assert d[f] in GRID_DURATIONS_MS
                    assert all(abs(math.log(d[f] / v)) <= abs(math.log(t / v)) + 1e-12
                               for t in GRID_DURATIONS_MS)  # fmt: skip
                else:
                    assert d[f] == v
    for i, ms in enumerate(GRID_DURATIONS_MS):
        assert parse_actions(f"wait{i}", "grid") == [Wait(ms=ms)]
        assert encode_answer(Answer((Wait(ms=ms),)), "grid") == f"wait{i}"


def test_grid_examples() -> None:
    text = "# close it\nclick520380\nhold1002004\ndrag508050202\ntype hi"
    answer = parse_answer_text(text, "grid")
    assert answer.thought == "close it"
    assert answer.actions == (
        Click(x=520, y=380), LongPress(x=100, y=200, ms=800),
        Swipe(x1=505, y1=805, x2=505, y2=205, ms=300), TypeText(text="hi"),
    )  # fmt: skip
    assert encode_answer(answer, "grid") == text
    assert re.fullmatch(answer_regex("grid", 4, True), text)
    assert not re.fullmatch(answer_regex("grid", 3, True), text)
    assert parse_actions("wait3\nback\ndone", "grid") == [Wait(ms=500), Back(), Done()]
    assert encode_answer(Answer((Click(x=1000, y=0),)), "grid") == "click999000"


def test_json_may_leave_ms_out_and_parse_accepts_whitespace() -> None:
    text = '{"type":"long_press","x":1,"y":2}'
    assert re.fullmatch(answer_regex("json"), text)
    assert parse_actions(text, "json") == [LongPress(x=1, y=2, ms=800)]
    assert parse_actions('{ "x": 1, "type": "click", "y": 2 }', "json") == [Click(x=1, y=2)]


# -- numbers: exactly the models' bounds -----------------------------------------------


def test_bounds_come_from_the_models() -> None:
    assert COORD == (0, 16384) and PRESS_MS == SWIPE_MS == (1, 10_000) and WAIT_MS == (1, 60_000)


@pytest.mark.parametrize("fmt", EXACT)
def test_the_grammar_admits_exactly_the_models_numbers(fmt: ActionFormat) -> None:
    rx = re.compile(answer_regex(fmt))

    def wait(n: str) -> str:
        return f"wait {n}" if fmt == "compact" else f'{{"type":"wait","ms":{n}}}'

    def click(n: str) -> str:
        return f"click {n} 7" if fmt == "compact" else f'{{"type":"click","x":{n},"y":7}}'

    for n in range(0, 100_000):
        assert bool(rx.fullmatch(wait(str(n)))) == (WAIT_MS[0] <= n <= WAIT_MS[1]), n
    for n in range(0, 20_000):
        assert bool(rx.fullmatch(click(str(n)))) == (n <= COORD[1]), n
    for bad in ("01", "-1", "+1", "1.0", "1e3", "", "00"):
        assert not rx.fullmatch(click(bad)), bad
        with pytest.raises(ActionFormatError):
            parse_actions(click(bad), fmt)


# -- bad input -------------------------------------------------------------------------

BAD_COMPACT = [
    "", "\n", "click", "click 1", "click 1 2 3", "click -1 2", "click 01 2", "click 16385 0",
    "click 1  2", "click 1 2 ", " click 1 2", "click 1 2\n", "Click 1 2", "tap 1 2",
    "wait 0", "wait 60001", "wait", "long_press 1 2", "long_press 1 2 0", "long_press 1 2 10001",
    "swipe 1 2 3 4", "swipe 1 2 3 4 5 6", "back 1", "done now", "type", "typehello",
    "type a\x00b", "type a\tb", "#\nback", "# \nback", "#no space\nback", "# only a thought",
    "back\n\nback", "back\r\nback", "\n".join(["back"] * (MAX_CHUNK + 1)),
    "# " + "x" * 81 + "\nback", "click 1 2\n# late thought",
]  # fmt: skip
BAD_JSON = [
    "", "{", '{"type":"click","x":1}', '{"type":"click","x":-1,"y":4}', '{"type":"jump"}',
    '{"type":"click","x":1,"y":2,"z":3}', '{"actions":[]}', "[]", "click 1 2",
    '{"type":"click","x":1.5,"y":2}', '{"type":"click","x":"1","y":2}',
    '{"actions":[' + ",".join(['{"type":"back"}'] * (MAX_CHUNK + 1)) + "]}",
]  # fmt: skip


BAD_GRID = [
    "", "click", "click52038", "click5203800", "click 520 380", "click520 380", "Click520380",
    "hold520380", "hold52038044", "drag50805020", "drag5080502033", "drag 508050202",
    "wait", "wait10", "wait 3", "back1", "done0", "type", "typehello", "tap520380",
    "swipe508050202", "long_press5203804", "click520380\n", "#\nback", "# \nback",
    "back\n\nback", "\n".join(["back"] * (MAX_CHUNK + 1)), "click-20380",
]  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "text"),
    [("compact", t) for t in BAD_COMPACT]
    + [("json", t) for t in BAD_JSON]
    + [("grid", t) for t in BAD_GRID],
)
def test_bad_answers_are_typed_errors_and_outside_the_grammar(fmt: ActionFormat, text: str) -> None:
    with pytest.raises(ActionFormatError):
        parse_answer_text(text, fmt)
    assert isinstance(ActionFormatError("x"), ValueError)  # callers may catch ValueError
    for k in range(1, MAX_CHUNK + 1):
        for thought in (False, True):
            assert not re.fullmatch(answer_regex(fmt, k, thought), text), (k, thought)


def test_the_step_limits_chunk_and_thought() -> None:
    with pytest.raises(ActionFormatError, match="allowed 2"):
        parse_answer_text("back\nback\nback", "compact", chunk=2)
    with pytest.raises(ActionFormatError, match="thought"):
        parse_answer_text("# hm\nback", "compact", thought=False)
    with pytest.raises(ActionFormatError, match="thought"):
        parse_answer_text('{"thought":"hm","actions":[{"type":"back"}]}', "json", thought=False)
    assert not re.fullmatch(answer_regex("compact", 1, False), "# hm\nback")
    assert not re.fullmatch(answer_regex("json", 1, False), '{"actions":[{"type":"back"}]}')
    assert re.fullmatch(answer_regex("json", 1, True), '{"actions":[{"type":"back"}]}')


def test_the_parser_takes_what_the_models_allow_beyond_the_grammar() -> None:
    # Longer or richer typed text than a model may write is still a valid action.
    long_text = "a" * 256
    assert parse_actions(f"type {long_text}", "compact") == [TypeText(text=long_text)]
    assert not re.fullmatch(answer_regex("compact"), f"type {long_text}")
    assert parse_actions('type say "hi" [ok]', "compact") == [TypeText(text='say "hi" [ok]')]
    with pytest.raises(ActionFormatError):
        parse_actions("type " + "a" * 257, "compact")
    assert len("type " + "a" * MAX_TYPED_CHARS) == 5 + MAX_TYPED_CHARS
    assert re.fullmatch(answer_regex("compact"), "type " + "a" * MAX_TYPED_CHARS)
    assert not re.fullmatch(answer_regex("compact"), "type " + "a" * (MAX_TYPED_CHARS + 1))


def test_what_compact_cannot_hold_is_refused_when_encoding() -> None:
    with pytest.raises(ActionFormatError, match="control"):
        encode_answer(Answer((TypeText(text="two\nlines"),)), "compact")
    with pytest.raises(ActionFormatError, match="thought"):
        encode_answer(Answer((Back(),), "x" * 81), "compact")
    with pytest.raises(ActionFormatError):
        encode_answer(Answer(()), "json")
    with pytest.raises(ActionFormatError):
        encode_answer(Answer((Back(),) * (MAX_CHUNK + 1)), "compact")


# -- budgets and cuts ------------------------------------------------------------------


def test_budgets_hold_the_longest_answers_for_the_sim_too() -> None:
    """The budget is measured with the real tokenizer (test_agent_actions_tokens.py); the
    sim counts with its pseudo-tokenizer, which must fit in it too, or the sim would cut."""
    for fmt, k, thought in SHAPES:
        budget = answer_token_budget(fmt, k, thought)
        for text in longest_answers(fmt, k, thought):
            assert re.fullmatch(answer_regex(fmt, k, thought), text)
            assert len(pseudo_tokens(text)) + 1 <= budget, (fmt, k, thought, text)
        if k > 1:
            assert budget > answer_token_budget(fmt, k - 1, thought)
        assert answer_token_budget("compact", k, thought) < answer_token_budget("json", k, thought)
    for fmt, k, thought, text in sim_answers(10):
        assert len(pseudo_tokens(text)) < answer_token_budget(fmt, k, thought)
    with pytest.raises(ValueError):
        answer_token_budget("json", MAX_CHUNK + 1)


# -- the sim engine answers the constraint -----------------------------------------------


async def test_the_sim_engine_answers_valid_actions_with_their_token_count() -> None:
    # A pixel-coordinate profile: its answers stay inside the 308 px frame.
    engine = SimEngine(SimSettings(delay_scale=0.0, vlm="qwen2.5-vl"))
    await engine.start()
    try:
        frame = Image(hash="cd" * 16, data=b"x", mime="image/jpeg", width=308, height=168)
        for i, (fmt, k, thought) in enumerate(SHAPES):
            c = ActionsConstraint(action_format=fmt, chunk=k, thought=thought)
            req = EngineRequest(
                request_id=f"a{i}", images=(frame,),
                messages=(ChatMessage(role="user", content=f"step {i}: next action?"),),
                sampling=Sampling(max_tokens=answer_token_budget(fmt, k, thought)),
                constraint=c,
            )  # fmt: skip
            deltas = [d async for d in engine.generate(req)]
            text = "".join(d.text for d in deltas)
            assert deltas[-1].finish_reason == "stop"
            assert deltas[-1].completion_tokens == len(pseudo_tokens(text))
            answer = parse_answer_text(text, fmt, chunk=k, thought=thought)
            assert len(answer.actions) == k
            points = [v for a in answer.actions for f, v in a.model_dump().items() if f != "ms"]
            side = 308 if fmt != "grid" else RELATIVE_SCALE  # grid: 0..999 whatever the profile
            assert all(v < side for v in points if isinstance(v, int))
        # Below the derived budget it is cut, as a real engine would be.
        short = EngineRequest(request_id="cut", images=(frame,), prompt="x",
                              sampling=Sampling(max_tokens=3),
                              constraint=ActionsConstraint(action_format="json"))  # fmt: skip
        deltas = [d async for d in engine.generate(short)]
        assert deltas[-1].finish_reason == "length"
        cut = agent_answer("".join(d.text for d in deltas), "length", ActionsConstraint(), None)
        assert isinstance(cut, Cut) and cut.reason == "length"
    finally:
        await engine.close()
