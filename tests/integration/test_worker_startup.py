"""A worker that cannot serve says why and exits; it never runs half-configured."""

from __future__ import annotations

import pytest

from tests.support.fleet import service_process


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SY_ENGINE": "nope"}, "engine"),
        ({"SY_ENGINE": "llamacpp", "SY_LLAMACPP_MODEL_PATH": "/nonexistent/model.gguf"},
         "/nonexistent/model.gguf"),
    ],
    ids=["unknown-engine", "missing-model-file"],
)  # fmt: skip
def test_worker_refuses_to_start_with_a_clear_reason(
    nats_url: str, env: dict[str, str], says: str
) -> None:
    with service_process("worker", nats_url, SY_ASSIGNMENT="static", **env) as child:
        child.proc.wait(60)
        err = child.output()
    assert child.proc.returncode != 0
    assert says in err
