"""The one answer parser (`agentactions.parse_answer_text`) and the worker's output step
(`services/worker/output.py`): what both old parsers accepted and refused (the edge's
`messages.agent.parse_answer` and `agentactions`' own), cut or whole, and the mapping to
the phone's pixels, whose text is byte for byte what the worker wrote before it parsed once
(`tests.support.agentanswers.old_mapping`, the algorithm it replaced, is the oracle)."""

from __future__ import annotations

import json
import random

import pytest

from services.worker.output import AgentAnswer, Cut, agent_answer
from switchyard.agentactions import (
    ActionFormatError,
    Answer,
    encode_answer,
    parse_actions,
    parse_answer_text,
)
from switchyard.agentprompt import Geometry
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim_output import sim_answer
from switchyard.messages.agent import (
    MAX_CHUNK,
    ActionFormat,
    Back,
    Click,
    LongPress,
    Swipe,
    TypeText,
    Wait,
)
from switchyard.messages.inference import ActionsConstraint, FrameGeometry, Image
from switchyard.vlmgeometry import vlm_profile
from tests.support.agentanswers import old_mapping
from tests.unit.test_agent_actions import sim_answers

# 720p seen as 308x168 (pixels), and a tall phone seen as 704x1280 (0-1000).
PIXELS = Geometry(orig_width=1280, orig_height=720, width=308, height=168, vlm="qwen2.5-vl")
RELATIVE = Geometry(1080, 2400, 704, 1280, "qwen3-vl")
ANY = ActionsConstraint(action_format="json", chunk=MAX_CHUNK, thought=True)


def whole(
    text: str, g: Geometry | None, fmt: ActionFormat = "json", chunk: int = 1, thought: bool = False
) -> AgentAnswer:
    c = ActionsConstraint(action_format=fmt, chunk=chunk, thought=thought)
    out = agent_answer(text, "stop", c, None if g is None else g.frame_geometry())
    assert isinstance(out, AgentAnswer), out
    return out


# -- the one parser ----------------------------------------------------------------------


def test_json_answers_in_both_shapes() -> None:
    """What `messages.agent.parse_answer` was tested with, and the shapes between."""
    assert parse_actions('{"type":"click","x":3,"y":4}', "json") == [Click(x=3, y=4)]
    chunk = parse_actions('{"actions":[{"type":"back"},{"type":"wait","ms":5}]}', "json")
    assert chunk == [Back(), Wait(ms=5)]
    with pytest.raises(ActionFormatError):
        parse_actions('{"type":"click","x":-1,"y":4}', "json")
    with_thought = parse_answer_text('{"thought":"hm","actions":[{"type":"back"}]}', "json")
    assert with_thought == Answer((Back(),), "hm")
    # Whitespace and another key order are the models' JSON too; a default may be left out.
    spaced = '  { "actions" : [ { "y": 2, "type": "click", "x": 1 } ] }\n'
    assert parse_actions(spaced, "json") == [Click(x=1, y=2)]
    assert parse_actions('{"type":"swipe","x1":1,"y1":2,"x2":3,"y2":4}', "json") == [
        Swipe(x1=1, y1=2, x2=3, y2=4, ms=300)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "", "   ", "null", "[]", '"click"', '{"actions":[]}', '{"thought":"x"}',
        '{"actions":[{"type":"back"}],"extra":1}', '{"type":"click","x":1,"y":2,"ms":3}',
        '{"type":"long_press","x":1,"y":2,"ms":0}', '{"type":"type","text":1}',
        '{"type":"type","text":"' + "a" * 257 + '"}', '{"type":"wait"}', '{"type":"click","x":1,',
        '{"thought":"' + "x" * 81 + '","actions":[{"type":"back"}]}',
        '{"actions":[' + ",".join(['{"type":"done"}'] * (MAX_CHUNK + 1)) + "]}",
    ],
)  # fmt: skip
def test_json_non_answers_are_typed_errors(text: str) -> None:
    with pytest.raises(ActionFormatError):
        parse_answer_text(text, "json")


def test_json_written_again_as_it_was_written() -> None:
    """What the grammar admits encodes back to itself, a left-out `ms` included."""
    for text, wrapped in [
        ('{"type":"long_press","x":1,"y":2}', False),
        ('{"type":"long_press","x":1,"y":2,"ms":800}', False),
        ('{"actions":[{"type":"swipe","x1":1,"y1":2,"x2":3,"y2":4},{"type":"back"}]}', True),
        ('{"thought":"go","actions":[{"type":"type","text":"hi there"}]}', True),
    ]:
        assert encode_answer(parse_answer_text(text, "json"), "json", wrapped=wrapped) == text
    # Built in code, a default is what it is: written out.
    assert encode_answer(Answer((LongPress(x=1, y=2),)), "json") == (
        '{"type":"long_press","x":1,"y":2}'
    )
    assert encode_answer(Answer((LongPress(x=1, y=2, ms=800),)), "compact") == "long_press 1 2 800"


# -- cut or whole ------------------------------------------------------------------------


def test_cut_answers() -> None:
    compact = ActionsConstraint(action_format="compact")
    assert isinstance(agent_answer("click 520 1180", "stop", compact, None), AgentAnswer)
    cut = agent_answer("click 520 11", "length", compact, None)  # parses, but was cut
    assert isinstance(cut, Cut) and cut.reason == "length" and "max_tokens" in cut.detail
    bad = agent_answer('{"type":"click","x":5', "stop", ActionsConstraint(), None)
    assert isinstance(bad, Cut) and bad.reason == "unparseable" and "json" in bad.detail
    too_many = agent_answer("back\nback", "stop", compact, None)
    assert isinstance(too_many, Cut) and too_many.reason == "unparseable"
    thought = agent_answer("# hm\nback", "stop", compact, PIXELS.frame_geometry())
    assert isinstance(thought, Cut) and "thought" in thought.detail
    # A JSON thought no format may write again (no grammar admits a control character).
    odd = agent_answer('{"thought":"a\\nb","actions":[{"type":"back"}]}', "stop", ANY,
                       PIXELS.frame_geometry())  # fmt: skip
    assert isinstance(odd, Cut) and odd.reason == "unparseable"


def test_without_a_frame_the_text_is_the_models() -> None:
    text = '{ "type": "click", "x": 5, "y": 6 }'
    out = whole(text, None)
    assert out.text == text and out.answer.actions == (Click(x=5, y=6),)


# -- coordinates back to the original frame ---------------------------------------------


def test_compact_answers_map_to_original_pixels_and_stay_compact() -> None:
    assert whole("click 154 84", PIXELS, "compact").text == "click 642 362"
    out = whole("# close it\nswipe 0 0 307 167 300\nback\nlong_press 9999 5 800", PIXELS,
                "compact", chunk=3, thought=True)  # fmt: skip
    assert out.text == "# close it\nswipe 2 2 1277 717 300\nback\nlong_press 1279 23 800"
    assert out.answer.thought == "close it"
    assert out.answer.actions == parse_answer_text(out.text, "compact").actions
    # The same answer in JSON maps to the same points.
    js = whole('{"type":"click","x":154,"y":84}', PIXELS)
    assert js.answer.actions == (Click(x=642, y=362),)


def test_json_answers_map_to_original_pixels_in_both_shapes() -> None:
    bare = whole('{"type":"click","x":154,"y":84}', PIXELS).text
    assert json.loads(bare) == {"type": "click", "x": 642, "y": 362}
    chunk = whole(
        '{"thought":"close it","actions":[{"type":"swipe","x1":0,"y1":0,"x2":307,"y2":167,'
        '"ms":300},{"type":"back"},{"type":"long_press","x":9999,"y":5}]}',
        PIXELS, chunk=3, thought=True,
    )  # fmt: skip
    out = json.loads(chunk.text)
    assert out["thought"] == "close it"
    assert out["actions"][0] == {"type": "swipe", "x1": 2, "y1": 2, "x2": 1277, "y2": 717,
                                 "ms": 300}  # fmt: skip
    assert out["actions"][1] == {"type": "back"}
    # Off-screen model output lands on the edge; the `ms` it left out stays out.
    assert out["actions"][2] == {"type": "long_press", "x": 1279, "y": 23}
    assert chunk.answer.actions[2] == LongPress(x=1279, y=23, ms=800)
    same = Geometry(orig_width=308, orig_height=168, width=308, height=168, vlm="qwen2.5-vl")
    assert json.loads(whole('{"type":"click","x":10,"y":20}', same).text)["x"] == 10


def test_answers_map_in_both_formats_for_a_relative_profile() -> None:
    assert whole("click 500 250", RELATIVE, "compact").text == "click 540 600"
    out = whole("# swipe up\nswipe 500 900 500 100 300\nlong_press 1000 0 800", RELATIVE,
                "compact", chunk=2, thought=True)  # fmt: skip
    assert out.text == "# swipe up\nswipe 540 2160 540 240 300\nlong_press 1079 0 800"
    js = whole('{"type":"click","x":500,"y":250}', RELATIVE)
    assert js.answer.actions == (Click(x=540, y=600),)
    assert TypeText(text="x") == whole('{"type":"type","text":"x"}', RELATIVE).answer.actions[0]


@pytest.mark.parametrize("g", [PIXELS, RELATIVE], ids=["pixels", "relative"])
def test_grid_answers_map_from_the_grid_for_every_profile_and_keep_their_text(
    g: Geometry,
) -> None:
    """The grid is 0..1000 whatever the profile: a pixel profile's answer maps the same."""
    text = "# swipe up\nclick500250\ndrag509050103\nhold9990000"
    out = whole(text, g, "grid", chunk=3, thought=True)
    assert out.text == text  # the model's own text; the actions are the phone's pixels
    w, h = g.orig_width, g.orig_height
    assert out.answer.actions == (
        Click(x=500 * w // 1000, y=250 * h // 1000),
        Swipe(x1=505 * w // 1000, y1=905 * h // 1000, x2=505 * w // 1000, y2=105 * h // 1000,
              ms=500),
        LongPress(x=999 * w // 1000, y=0, ms=100),
    )  # fmt: skip
    assert out.answer.thought == "swipe up"
    for fmt, k, thought, answer in sim_answers(5):
        if fmt == "grid":
            c = ActionsConstraint(action_format=fmt, chunk=k, thought=thought)
            mapped = agent_answer(answer, "stop", c, g.frame_geometry())
            assert isinstance(mapped, AgentAnswer) and mapped.text == answer
            for a in mapped.answer.actions:
                for kx, ky in (("x", "y"), ("x1", "y1"), ("x2", "y2")):
                    if kx in type(a).model_fields:
                        assert 0 <= getattr(a, kx) < w and 0 <= getattr(a, ky) < h


@pytest.mark.parametrize("g", [PIXELS, RELATIVE], ids=["pixels", "relative"])
def test_every_sim_answer_maps_to_the_text_the_worker_wrote_before(g: Geometry) -> None:
    rng = random.Random(7)
    frame = Image(hash="ab" * 16, data=b"x", mime="image/jpeg", width=g.width, height=g.height)
    req = EngineRequest(request_id="r", images=(frame,))
    coords = vlm_profile(g.vlm).coords
    fg: FrameGeometry = g.frame_geometry()
    for fmt in ("json", "compact"):  # the formats that write pixels again (grid: below)
        for chunk in range(1, MAX_CHUNK + 1):
            for thought in (False, True):
                c = ActionsConstraint(action_format=fmt, chunk=chunk, thought=thought)
                for _ in range(20):
                    text = sim_answer(c, req, rng, coords)
                    out = agent_answer(text, "stop", c, fg)
                    assert isinstance(out, AgentAnswer), (text, out)
                    assert out.text == old_mapping(text, g, fmt), text
                    assert out.answer == parse_answer_text(out.text, fmt)
    # JSON leaving `ms` out, as the grammar allows: the old text too.
    for text in (
        '{"type":"long_press","x":10,"y":20}',
        '{"actions":[{"type":"swipe","x1":1,"y1":2,"x2":300,"y2":160},{"type":"done"}]}',
    ):
        chunk = 1 if text.startswith('{"type"') else 2
        assert whole(text, g, chunk=chunk).text == old_mapping(text, g, "json")
