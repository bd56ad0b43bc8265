"""Every service run by `switchyard.service` answers probes beside `/metrics`, not only
the worker (test_worker_probes.py): here the preprocessor, in its process, on a real
nats-server reached through a proxy the test cuts. Started and ready once connected;
not ready while NATS is unreachable, and ready again once it is back."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from switchyard.bus.connection import Bus
from switchyard.fleet.processes import Child
from switchyard.ports import free_port
from tests.support.fleet import provision_pool, service_process
from tests.support.poll import until
from tests.support.probes import probe
from tests.support.proxy import CuttableProxy


async def answers(child: Child, port: int, path: str, status: int) -> bool:
    child.check()
    return (await probe(port, path))[0] == status


async def test_a_service_is_ready_only_while_connected(
    bus: Bus, nats_url: str, unique: str
) -> None:
    await provision_pool(bus.js, f"sp{unique}")  # the streams it reads
    proxy = CuttableProxy(upstream_port=urlparse(nats_url).port or 4222)
    await proxy.open()
    port = free_port()
    try:
        with service_process("preprocessor", proxy.url, SY_METRICS_PORT=str(port)) as child:
            await until(lambda: answers(child, port, "readyz", 200), timeout=60, what="ready")
            assert await probe(port, "startupz") == (200, {"ok": True, "checks": {"bus": "ok"}})
            _, body = await probe(port, "readyz")
            assert body == {"ok": True, "checks": {"bus": "ok", "stopping": "ok"}}
            await proxy.cut()
            await until(lambda: answers(child, port, "readyz", 503), timeout=10,
                        what="not ready with NATS cut off")  # fmt: skip
            _, body = await probe(port, "readyz")
            assert body["checks"]["bus"] == "NATS disconnected (reconnecting)", body
            assert (await probe(port, "healthz"))[0] == 200
            await proxy.open()
            await until(lambda: answers(child, port, "readyz", 200), timeout=30,
                        what="ready again once NATS is back")  # fmt: skip
    finally:
        await proxy.cut()


async def test_sqlflow_is_started_only_once_its_pipeline_is_built(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {"SY_METRICS_PORT": str(port), "SY_KNOWLEDGE_INDEX": str(tmp_path / "index"),
           "SY_SQL_POLICY_DIR": str(tmp_path / "policies")}  # fmt: skip
    with service_process("sqlflow", nats_url, **env) as child:
        await until(lambda: answers(child, port, "startupz", 200), timeout=120, what="started")
        _, body = await probe(port, "readyz")
        assert body["checks"] == {"pipeline": "ok", "bus": "ok", "stopping": "ok"}, body
