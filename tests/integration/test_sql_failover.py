"""A question asked while its stream elects a leader waits, as a chat does, and is answered.

A 3-node JetStream cluster (real `nats-server`s, every stream R3) runs the Text2SQL
services (validator, executor on the private MariaDB, sqlflow) and the edge, all on the
two members that do not lead INGRESS. The INGRESS leader is killed (-9): until the two
elect a new one (seconds), nothing takes a publish on `sql.in.<t>` and an impatient one
fails at once (as `/v1/sql/ask` did before it shared the chat's lifecycle). The edge's
publish is patient (`INGRESS_PATIENCE`), so the question asked then is answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from switchyard.bus.connection import connect
from switchyard.bus.provision import provision
from switchyard.bus.publish import publish, transient
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.config import Settings
from switchyard.messages.inference import Cancel
from switchyard.natsserver import EmbeddedCluster
from switchyard.text2sql.knowledge import KnowledgeStore
from tests.support.edge import edge_in_process, write_keys
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import KNOWLEDGE, sqlflow_in_process
from tests.support.sqlservices import sql_services

VERIFIED = KnowledgeStore(KNOWLEDGE).load("acme").verified[0]
AUTH = {"Authorization": "Bearer sk-acme"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(tmp_path_factory.mktemp("sql-cluster"), 3) as group:
        yield group


async def test_a_question_asked_during_a_leader_election_waits_and_is_answered(
    cluster: EmbeddedCluster, sqlenv: SqlEnv, tmp_path: Path
) -> None:
    setup = await connect(Settings(nats_url=cluster.url), "test-sql-failover-setup")
    try:
        await provision(setup.js, build_topology(TopologySettings(replicas=3, partitions=1)))
        info = await setup.js.stream_info("INGRESS")
        assert info.cluster is not None and info.cluster.leader, info
        leader = info.cluster.leader
    finally:
        await setup.close()
    # Everything on the members that survive: a client of the killed one would reconnect.
    url = ",".join(s.url for s in cluster.servers if s.name != leader)
    keys = write_keys(tmp_path / "keys.yaml", {"sk-acme": {"tenant": "acme"}})
    body = {"question": VERIFIED.question, "no_cache": True}
    async with (
        sql_services(url, sqlenv),
        sqlflow_in_process(url, sqlenv, tmp_path / "index"),
        edge_in_process(url, api_keys_file=keys) as edge,
        httpx.AsyncClient(base_url=edge, timeout=120) as http,
    ):  # fmt: skip
        probe = await connect(Settings(nats_url=url), "test-sql-failover-probe")
        try:
            warm = await http.post("/v1/sql/ask", json=body, headers=AUTH)
            assert warm.status_code == 200 and warm.json()["path"] == "verified", warm.text
            cluster.member(leader).kill()
            # What an impatient publish on INGRESS gets now: an error, at once.
            with pytest.raises(Exception) as refused:
                await publish(probe.js, "llm.edge.probe", Cancel(tenant="t", request_id="R"),
                              timeout=1.0)  # fmt: skip
            assert transient(refused.value), refused.value
            r = await http.post("/v1/sql/ask", json=body, headers=AUTH)
        finally:
            await probe.close()
            await asyncio.to_thread(cluster.restart, leader)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "ok" and out["path"] == "verified" and out["rows"], out
    assert out["request_id"] == r.headers["x-request-id"]
