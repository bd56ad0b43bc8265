"""proto/ is what the code generates, its schemas are valid and describe the messages we send,
and AsyncAPI covers every subject family and stream (ARCHITECTURE.md, Subjects, streams and KV)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from switchyard import proto, subjects
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.codec import decode, decode_envelope, encode
from tests.conftest import REPO
from tests.unit.test_codec import PLAIN, SAMPLES

PROTO = REPO / "proto"
SCHEMAS = PROTO / "schemas"

# Subject families (ARCHITECTURE.md, Subjects, streams and KV), as the prefix each address has.
FAMILIES = {
    "agent.in": "agent.in.",
    "sql.in": "sql.in.",
    "llm.in": "llm.in.",
    "req": "req.",
    "work": "work.",
    "res": "res.",
    "audit": "audit.",
    "cancel": "cancel.",
    "svc.sql.*": "svc.sql.",
    "dlq": "dlq.",
}


@cache
def asyncapi() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROTO / "asyncapi.yaml").read_text())
    return doc


def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.json").read_text())
    return loaded


def validator(model: type[BaseModel]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema(model.__name__))


def test_committed_proto_matches_the_code() -> None:
    assert proto.drift(PROTO) == [], "proto/ drifted from the code: run `sy proto`"


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.json")), ids=lambda p: p.stem)
def test_every_schema_is_valid_draft_2020_12(path: Any) -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))


def test_every_model_has_a_schema_file() -> None:
    assert {p.stem for p in SCHEMAS.glob("*.json")} == {m.__name__ for m in proto.MODELS}


def test_asyncapi_lists_every_subject_family() -> None:
    addresses = [ch["address"] for ch in asyncapi()["channels"].values()]
    missing = [
        f for f, prefix in FAMILIES.items() if not any(a.startswith(prefix) for a in addresses)
    ]
    assert missing == []
    for service in (subjects.SQL_VALIDATE, subjects.SQL_EXECUTE):
        assert service in addresses


def test_asyncapi_lists_every_stream_with_its_subjects() -> None:
    doc = asyncapi()
    described = doc["info"]["description"]
    transports = " ".join(ch["description"] for ch in doc["channels"].values())
    for stream in build_topology(TopologySettings()).streams:
        assert f"{stream.name} ({stream.retention})" in described
        for subject in stream.subjects:
            assert subject in described
        assert f"stream {stream.name}" in transports, f"no channel is stored in {stream.name}"


def test_every_referenced_message_has_a_schema_file() -> None:
    doc = asyncapi()
    components = doc["components"]["messages"]
    for name, channel in doc["channels"].items():
        for ref in channel["messages"].values():
            target = ref["$ref"].removeprefix("#/components/messages/")
            assert target in components, f"channel {name} references unknown message {target}"
    for name, message in components.items():
        path = PROTO / message["payload"]["$ref"]
        assert path.is_file(), f"message {name} has no schema file {path}"
    for name, op in doc["operations"].items():
        assert op["channel"]["$ref"].removeprefix("#/channels/") in doc["channels"], name


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: f"{type(m).__name__}-{m.kind}")
def test_decoded_envelope_validates_against_its_schema(message: BaseModel) -> None:
    decoded = decode_envelope(encode(message))
    validator(type(message)).validate(decoded.model_dump(mode="json"))


@pytest.mark.parametrize("message", PLAIN, ids=lambda m: type(m).__name__)
def test_decoded_plain_message_validates_against_its_schema(message: BaseModel) -> None:
    decoded = decode(encode(message), type(message))
    validator(type(message)).validate(decoded.model_dump(mode="json"))


def test_schema_rejects_an_unknown_field() -> None:
    sample = SAMPLES[1].model_dump(mode="json") | {"surprise": 1}
    with pytest.raises(jsonschema.ValidationError):
        validator(type(SAMPLES[1])).validate(sample)
