"""schemathesis against the edge's own OpenAPI: every operation, valid and invalid inputs,
in-process over ASGI (schemathesis runs the app's lifespan, which connects to NATS) with a
`sim` fleet at zero delay behind it. No 5xx, no crash, no hang; bounded for CI."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.schemas import OpenApiSchema

from services.edge.app import create_app
from services.edge.settings import EdgeSettings
from tests.support.edge import sim_fleet_in_thread, write_keys

# Per operation and mode; raise it locally (SY_EDGE_FUZZ_EXAMPLES=500) for a deeper run.
EXAMPLES = int(os.environ.get("SY_EDGE_FUZZ_EXAMPLES", "25"))
POOL = "edgefuzz"
KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
POLICY = {"default": {"itpm": 100_000_000, "otpm": 100_000_000, "max_queued_tokens": 10**9}}


@pytest.fixture(scope="module")
def edge_schema(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenApiSchema]:
    tmp = tmp_path_factory.mktemp("edge-fuzz")
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    keys = write_keys(tmp / "keys.yaml", {KEY: {"tenant": "fuzz"}})
    with sim_fleet_in_thread(nats_url, POOL, policy, delay_scale=0.0, sqlflow_dir=tmp):
        # Short waits: a request the fleet cannot answer fails fast instead of hanging.
        app = create_app(
            EdgeSettings(nats_url=nats_url, api_keys_file=keys, chat_pool=POOL,
                         request_timeout=20, idle_timeout=10, idempotency_wait=10,
                         sql_timeout=10)
        )  # fmt: skip
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        # A generated body over the size cap is refused with 413 before it is parsed.
        rejection = schema.config.checks.negative_data_rejection
        rejection.expected_statuses = [*rejection.expected_statuses, "413"]
        # No schema can say "this base64 is a real PNG": a schema-valid frame that is not
        # an image is rightly refused with 422 by the agent step.
        acceptance = schema.config.checks.positive_data_acceptance
        acceptance.expected_statuses = [*acceptance.expected_statuses, "422"]
        yield schema


def operations() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) for every operation in the edge's OpenAPI (read without a bus):
    valid inputs for all, invalid ones where there is a body or query to get wrong."""
    spec = create_app(EdgeSettings()).openapi()
    out = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            out.append((method.upper(), path, GenerationMode.POSITIVE))
            params = [p for p in op.get("parameters", []) if p["in"] != "header"]
            if "requestBody" in op or params:
                out.append((method.upper(), path, GenerationMode.NEGATIVE))
    return out


# Spelled out (not `schema.parametrize()`): schemathesis' lazy fixture loader touches
# `Item._nodeid`, which pytest 9 no longer has. One test per operation and mode either way.
@pytest.mark.parametrize(("method", "path", "mode"), operations())
def test_edge_openapi_fuzz(
    edge_schema: OpenApiSchema, method: str, path: str, mode: GenerationMode
) -> None:
    operation = edge_schema[path][method]

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def fuzz(case: schemathesis.Case[Any]) -> None:
        response = case.call(headers=AUTH, timeout=30)
        # /readyz answers 503 by design (documented) for a pool with no worker.
        not_ready = path == "/readyz" and response.status_code == 503
        assert response.status_code < 500 or not_ready, (
            response.status_code,
            response.text[:500],
        )
        if not_ready:
            assert response.json()["nats"] is True
        case.validate_response(
            response, headers=AUTH, excluded_checks=[not_a_server_error] if not_ready else None
        )

    fuzz()
