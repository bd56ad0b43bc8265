"""The edge in-process under uvicorn on a free port (the openai SDK needs real HTTP), and
the small fleets the edge's tests run behind it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import yaml

from services.edge.settings import EdgeSettings
from switchyard.apikeys import hash_key
from switchyard.fleet import Edge, FleetSpec, Pool, env_of, launch
from switchyard.fleet.inproc import InprocGroup
from switchyard.fleet.spec import Engine
from switchyard.ports import free_port
from tests.conftest import REPO
from tests.support.loopthread import in_thread


def write_keys(path: Path, keys: dict[str, dict[str, Any]]) -> Path:
    """`keys`: plain key -> {tenant, models?}; the file stores only hashes."""
    path.write_text(yaml.safe_dump({"keys": {hash_key(k): v for k, v in keys.items()}}))
    return path


@contextlib.asynccontextmanager
async def edge_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[str]:
    """Yields the base URL (`http://127.0.0.1:<port>`, https with `https_cert`) once the
    edge listens."""
    settings = EdgeSettings(nats_url=nats_url, port=free_port(), **overrides)
    async with InprocGroup() as group:
        await group.serve_edge("test-edge", settings)
        yield f"{settings.scheme}://127.0.0.1:{settings.port}"


@contextlib.contextmanager
def sim_fleet_in_thread(
    nats_url: str, pool: str, policy: Path, delay_scale: float = 0.0,
    sqlflow_dir: Path | None = None,
) -> Iterator[None]:  # fmt: skip
    """Router + `sim` worker + preprocessor on their own event loop in a thread, ready;
    with `sqlflow_dir`, a sqlflow too (no SQL policies there: every question is answered
    `unknown_tenant` at once, without a model or a database).

    For synchronous tests (schemathesis, benchmarks) whose callers do not run an asyncio
    loop of their own while they wait on the fleet.
    """
    services: tuple[str, ...] = ("router", "preprocessor")
    service_env = {"preprocessor": env_of(chat_pool=pool)}
    if sqlflow_dir is not None:
        (sqlflow_dir / "policies").mkdir(parents=True, exist_ok=True)
        services += ("sqlflow",)
        service_env["sqlflow"] = env_of(
            knowledge_dir=REPO / "deploy" / "knowledge", knowledge_index=sqlflow_dir / "index",
            sql_policy_dir=sqlflow_dir / "policies",
        )  # fmt: skip
    spec = FleetSpec(
        pools=(Pool(pool, env=env_of(sim_delay_scale=delay_scale)),), engine="sim", partitions=4,
        services=services, tenant_policy=policy, service_env=service_env,
        heartbeat_interval=0.3, rebalance_interval=0.2,
    )  # fmt: skip

    @contextlib.asynccontextmanager
    async def fleet() -> AsyncIterator[None]:
        async with launch(spec, mode="inproc", nats_url=nats_url):
            yield

    with in_thread(fleet, name=f"sim-fleet-{pool}"):
        yield


@contextlib.asynccontextmanager
async def agent_fleet_with_edge(
    nats_url: str, pool: str, keys: Path, *, engine: Engine, preprocessor: dict[str, Any],
    edge: dict[str, Any], worker: dict[str, Any] | None = None,
) -> AsyncIterator[str]:  # fmt: skip
    """Router, one worker, preprocessor and edge for a private agent `pool`; yields the
    edge's URL once every partition is bound by the worker and the edge is ready.
    `preprocessor` and `edge`: settings fields of those two; `worker`: the worker's
    (its engine's too, e.g. `sim_vlm`)."""
    spec = FleetSpec(
        pools=(Pool(pool, env=env_of(**(worker or {}))),), engine=engine, partitions=4,
        service_env={"preprocessor": env_of(agent_pool=pool, chat_pool=pool, frame_procs=0,
                                            **preprocessor)},
        edge=Edge(keys_file=keys, env=env_of(chat_pool=pool, agent_pool=pool, **edge)),
        heartbeat_interval=0.3, rebalance_interval=0.2,
    )  # fmt: skip
    async with launch(spec, mode="inproc", nats_url=nats_url) as fleet:
        assert fleet.edge_url is not None
        yield fleet.edge_url
