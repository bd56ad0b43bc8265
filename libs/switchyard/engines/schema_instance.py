"""A small valid instance of a JSON schema, for the simulator's structured outputs.

When a request asks for output matching a JSON schema, `SimEngine` must answer
with JSON that a caller's validator accepts (agents parse and validate their
actions), and of a realistic token count. `schema_instance` builds such an
instance: small (required properties, one array item unless `minItems` says
more), varied through the caller's `random.Random` (enum choices, numbers,
`oneOf` branches) so that seeded requests repeat and unseeded ones differ.

It is not a general JSON-schema generator: string `pattern`s are not honoured,
and only local `$ref`s resolve. A schema it finds unsatisfiable (an empty enum,
bounds that admit no number, ...) raises `EngineError(code="invalid_request")`,
the error a real engine's structured-output backend would give.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from switchyard.engines.base import EngineError
from switchyard.engines.sim_tokens import WORDS


def _unsatisfiable(reason: str) -> EngineError:
    return EngineError(f"JSON schema: {reason}", code="invalid_request")


class _InstanceBuilder:
    """Builds a small instance of a JSON schema, choosing among options with `rng`.

    Covers what agent action schemas use: objects (required properties plus
    any property with a `const`, so `oneOf` branches stay distinguishable),
    enum/const, integer/number bounds, strings (length, common formats),
    booleans, arrays (one item unless minItems says more), anyOf/oneOf/allOf
    and local `$ref`s. String `pattern`s are not honoured.
    """

    MAX_DEPTH = 32

    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self._root = root
        self._rng = rng

    def build(self, schema: Any, depth: int = 0) -> Any:
        if depth > self.MAX_DEPTH:
            raise _unsatisfiable(f"nested deeper than {self.MAX_DEPTH}")
        if schema is True:
            return None
        if schema is False or not isinstance(schema, Mapping):
            raise _unsatisfiable("a subschema admits no value")
        s = self._resolve(schema)
        if "const" in s:
            return s["const"]
        if "enum" in s:
            options = list(s["enum"])
            if not options:
                raise _unsatisfiable("empty enum")
            return self._rng.choice(options)
        for key in ("oneOf", "anyOf"):
            if key in s:
                branches = list(s[key])
                if not branches:
                    raise _unsatisfiable(f"empty {key}")
                rest = {k: v for k, v in s.items() if k != key}
                return self.build(
                    _merge(rest, self._resolve(self._rng.choice(branches))), depth + 1
                )
        kind = _schema_type(s)
        if kind == "object":
            return self._object(s, depth)
        if kind == "array":
            return self._array(s, depth)
        if kind == "string":
            return self._string(s)
        if kind == "integer":
            return self._integer(s)
        if kind == "number":
            return self._number(s)
        if kind == "boolean":
            return self._rng.random() < 0.5
        return None

    def _resolve(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        s = dict(schema)
        for _ in range(64):
            if "$ref" in s:
                target = self._pointer(s.pop("$ref"))
                s = _merge(target, s)
            elif "allOf" in s:
                parts = s.pop("allOf")
                for part in parts:
                    if not isinstance(part, Mapping):
                        raise _unsatisfiable("allOf holds a non-object subschema")
                    s = _merge(s, part)
            else:
                return s
        raise _unsatisfiable("$ref/allOf chain too long (a cycle?)")

    def _pointer(self, ref: Any) -> Mapping[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _unsatisfiable(f"only local $ref is supported, got {ref!r}")
        node: Any = self._root
        for raw in filter(None, ref[1:].split("/")):
            part = raw.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                raise _unsatisfiable(f"$ref {ref!r} points nowhere")
            node = node[part]
        if not isinstance(node, Mapping):
            raise _unsatisfiable(f"$ref {ref!r} is not a schema object")
        return node

    def _object(self, s: Mapping[str, Any], depth: int) -> dict[str, Any]:
        props: Mapping[str, Any] = s.get("properties") or {}
        keys = list(dict.fromkeys(s.get("required") or []))
        keys += [k for k, sub in props.items() if k not in keys and self._is_fixed(sub)]
        for k in props:
            if len(keys) >= int(s.get("minProperties", 0)):
                break
            if k not in keys:
                keys.append(k)
        extra = s.get("additionalProperties", True)
        out: dict[str, Any] = {}
        for k in keys:
            sub = props.get(k, extra if isinstance(extra, Mapping) else True)
            out[k] = self.build(sub, depth + 1)
        return out

    def _is_fixed(self, sub: Any) -> bool:
        if not isinstance(sub, Mapping):
            return False
        r = self._resolve(sub)
        return "const" in r or len(r.get("enum") or ()) == 1

    def _array(self, s: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = list(s.get("prefixItems") or [])
        items = s.get("items", True)
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, s.get("additionalItems", True)
        n = max(int(s.get("minItems", 0)), len(prefix) or 1)
        if s.get("maxItems") is not None:
            n = min(n, int(s["maxItems"]))
        out: list[Any] = []
        for i in range(n):
            if i < len(prefix):
                out.append(self.build(prefix[i], depth + 1))
            elif items is False:
                break
            else:
                out.append(self.build(items, depth + 1))
        if s.get("uniqueItems") and len(out) > 1:
            out = self._distinct(out, items, n, depth)
        return out

    def _distinct(self, out: list[Any], items: Any, n: int, depth: int) -> list[Any]:
        seen: list[Any] = []
        for value in out:
            for _ in range(16):
                if value not in seen:
                    break
                value = self.build(items, depth + 1)
            if value not in seen:
                seen.append(value)
        return seen if len(seen) >= n else out

    def _string(self, s: Mapping[str, Any]) -> str:
        text = _FORMATS.get(str(s.get("format")), "") or self._rng.choice(WORDS)
        min_len, max_len = int(s.get("minLength", 0)), s.get("maxLength")
        if len(text) < min_len:
            text += "x" * (min_len - len(text))
        if max_len is not None:
            text = text[: int(max_len)]
        return text

    def _bounds(self, s: Mapping[str, Any], step: float) -> tuple[float, float]:
        lo: float | None = s.get("minimum")
        hi: float | None = s.get("maximum")
        xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if xlo is True and lo is not None:  # draft-4 boolean form
            lo += step
        elif isinstance(xlo, int | float) and not isinstance(xlo, bool):
            lo = max(lo, xlo + step) if lo is not None else xlo + step
        if xhi is True and hi is not None:
            hi -= step
        elif isinstance(xhi, int | float) and not isinstance(xhi, bool):
            hi = min(hi, xhi - step) if hi is not None else xhi - step
        if lo is None:
            lo = 0 if hi is None else hi - 100
        if hi is None:
            hi = lo + 100
        if lo > hi:
            raise _unsatisfiable(f"no number in [{lo}, {hi}]")
        return lo, hi

    def _integer(self, s: Mapping[str, Any]) -> int:
        lo, hi = self._bounds(s, 1)
        ilo, ihi = math.ceil(lo), math.floor(hi)
        mult = s.get("multipleOf")
        if isinstance(mult, int) and mult > 0:
            klo, khi = -(-ilo // mult), ihi // mult
            if klo > khi:
                raise _unsatisfiable(f"no multiple of {mult} in [{lo}, {hi}]")
            return self._rng.randint(klo, khi) * mult
        if ilo > ihi:
            raise _unsatisfiable(f"no integer in [{lo}, {hi}]")
        return self._rng.randint(ilo, ihi)

    def _number(self, s: Mapping[str, Any]) -> float:
        lo, hi = self._bounds(s, 1e-6)
        value = round(self._rng.uniform(lo, hi), 2)
        return value if lo <= value <= hi else (lo + hi) / 2


_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00Z",
    "email": "sim@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
}


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        if k == "properties" and isinstance(out.get(k), Mapping):
            out[k] = {**out[k], **v}
        elif k == "required" and isinstance(out.get(k), list):
            out[k] = list(dict.fromkeys([*out[k], *v]))
        else:
            out[k] = v
    return out


def _schema_type(s: Mapping[str, Any]) -> str:
    t = s.get("type")
    if isinstance(t, list):
        concrete = [x for x in t if x != "null"]
        t = concrete[0] if concrete else "null"
    if isinstance(t, str):
        return t
    if "properties" in s or "required" in s:
        return "object"
    if "items" in s or "prefixItems" in s:
        return "array"
    return "null"


def schema_instance(schema: Mapping[str, Any], rng: random.Random) -> Any:
    """A small instance that validates against `schema` (see `_InstanceBuilder`)."""
    return _InstanceBuilder(schema, rng).build(schema)
