"""The `sy` command line against a real nats-server, run as a separate process like a user would."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from switchyard.bus.connection import Bus
from switchyard.bus.tokenstream import TokenStreamWriter
from switchyard.cli import up
from switchyard.cli.app import app
from switchyard.codec import decode
from switchyard.messages.inference import ChatRequest, GenerateRequest, GenerateResult
from tests.conftest import REPO

STREAMS = ("INGRESS", "REQ", "WORK", "RES", "AUDIT", "DLQ")


async def sy(nats_url: str, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run `sy <args>` in a fresh interpreter; returns (exit code, stdout, stderr)."""
    env = {**os.environ, "SY_NATS_URL": nats_url, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "switchyard.cli.app",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def provisioned(nats_url: str) -> str:
    code, out, err = await sy(nats_url, "provision")
    assert code == 0, out + err
    return out


async def test_provision_twice_changes_nothing_the_second_time(
    provisioned: str, nats_url: str
) -> None:
    code, out, err = await sy(nats_url, "provision")
    assert code == 0, out + err
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ unchanged", summary), out
    assert "created" not in out and "updated" not in out


async def test_streams_lists_the_topology(provisioned: str, nats_url: str) -> None:
    code, out, err = await sy(nats_url, "streams")
    assert code == 0, out + err
    for name in STREAMS:
        assert re.search(rf"\b{name}\b", out), f"{name} missing from:\n{out}"


async def test_publish_no_wait_stores_the_request_in_req(
    provisioned: str, nats_url: str, bus: Bus, tmp_path: Path, unique: str
) -> None:
    file = tmp_path / "generate.yaml"
    file.write_text(f"kind: generate\ntenant: t{unique}\nworkload: llm\nprompt: Hello there\n")
    code, out, err = await sy(nats_url, "publish", str(file), "--no-wait")
    assert code == 0, out + err
    found = re.search(r"published (\S+) to req\.llm\.t\w+: REQ #(\d+)", out)
    assert found, out
    stored = await bus.js.get_msg("REQ", int(found.group(2)))
    assert stored.subject == f"req.llm.t{unique}"
    message = decode(stored.data or b"", GenerateRequest)
    assert (message.id, message.prompt, message.tenant) == (
        found.group(1),
        "Hello there",
        f"t{unique}",
    )
    assert stored.headers and stored.headers.get("Nats-Msg-Id") == message.id


async def test_publish_waits_for_the_streamed_reply(
    provisioned: str, nats_url: str, bus: Bus, tmp_path: Path, unique: str
) -> None:
    tenant = f"t{unique}"
    # A tiny service: a JetStream pull consumer on the ingress subject, answering the inbox.
    sub = await bus.js.pull_subscribe(f"llm.in.{tenant}", stream="INGRESS")

    async def respond() -> ChatRequest:
        [msg] = await sub.fetch(1, timeout=60)
        request = decode(msg.data, ChatRequest)
        await msg.ack()
        assert request.reply, "the CLI must publish with a reply inbox"
        writer = TokenStreamWriter(bus.nc, request.reply)
        for piece in ("Hello", ", ", "world"):
            await writer.delta(piece)
        await writer.end(
            GenerateResult(
                tenant=request.tenant,
                request_id=request.id,
                workload="llm",
                status="ok",
                text="Hello, world",
                finish_reason="stop",
            )
        )
        return request

    responder = asyncio.create_task(respond())
    file = tmp_path / "chat.yaml"
    file.write_text(
        f"kind: llm.chat\ntenant: {tenant}\nmessages:\n  - role: user\n    content: say hello\n"
    )
    try:
        code, out, err = await sy(nats_url, "publish", str(file), "--timeout", "30")
        request = await asyncio.wait_for(responder, 10)
    finally:
        responder.cancel()
        await sub.unsubscribe()
    assert code == 0, out + err
    assert "Hello, world" in out.splitlines()[0]
    assert '"status": "ok"' in out and f'"request_id": "{request.id}"' in out
    assert f"published {request.id} to llm.in.{tenant}: INGRESS" in err


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("kind: [unclosed\n", "not JSON or YAML"),
        ("kind: no.such.kind\ntenant: t1\n", "unknown kind"),
        ("kind: generate\ntenant: t1\n", "workload"),
    ],
    ids=["not-yaml", "unknown-kind", "off-schema"],
)
async def test_publish_rejects_a_bad_file_clearly(
    nats_url: str, tmp_path: Path, text: str, reason: str
) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    code, out, err = await sy(nats_url, "publish", str(file), "--no-wait")
    assert code != 0
    assert reason in out + err
    assert "Traceback" not in out + err


def test_up_dry_run_prints_the_plan(nats_url: str) -> None:
    result = CliRunner().invoke(
        app, ["up", "--dry-run", "--nats", nats_url, "--workers", "2", "--engine", "sim"]
    )
    assert result.exit_code == 0, result.output
    assert f"{nats_url} is reachable: using it" in result.output
    assert "would provision streams " + ", ".join(STREAMS) in result.output
    for service in up.FLEET:
        if up.runnable(service.module):
            assert f"would start {service.name}" in result.output
        else:
            assert f"{service.name}  skipped: {service.module} has no __main__.py" in result.output
    for pool, name in (("llm", "worker"), ("agent", "worker-agent")):
        for replica in (f"{name}-1", f"{name}-2"):
            expected = (
                f"would start {replica}: python -m services.worker SY_POOL={pool} SY_ENGINE=sim"
            )
            assert expected in result.output


def test_up_roles_split_the_agent_pool_by_role(nats_url: str) -> None:
    result = CliRunner().invoke(
        app, ["up", "--dry-run", "--nats", nats_url, "--engine", "sim", "--roles", "2p1d"]
    )
    assert result.exit_code == 0, result.output
    for replica, role in (("1", "prefill"), ("2", "prefill"), ("3", "decode")):
        assert (f"would start worker-agent-{replica}: python -m services.worker SY_POOL=agent "
                f"SY_ENGINE=sim SY_WORKER_ROLE={role}") in result.output  # fmt: skip
    assert "would start worker: python -m services.worker SY_POOL=llm SY_ENGINE=sim\n" in (
        result.output
    )
    bad = CliRunner().invoke(app, ["up", "--dry-run", "--nats", nats_url, "--roles", "2q"])
    assert bad.exit_code != 0 and "counts of p, d or b" in bad.output


def test_up_dry_run_without_nats_would_start_an_embedded_one() -> None:
    result = CliRunner().invoke(app, ["up", "--dry-run", "--nats", "nats://127.0.0.1:1"])
    assert result.exit_code == 0, result.output
    assert "would start an embedded nats-server on 127.0.0.1:1" in result.output


def test_plan_runs_replicas_and_skips_packages_without_main() -> None:
    fleet = (
        up.Service("worker", "services.worker"),
        up.Service("edge", "services.edge"),
        up.Service("ghost", "services.no_such_service"),
    )
    procs, skipped = up.plan(fleet, workers=2, engine="sim")
    edge = ["edge"] if up.runnable("services.edge") else []
    assert [p.name for p in procs] == ["worker-1", "worker-2", *edge]
    assert all(p.env == {"SY_ENGINE": "sim"} for p in procs[:2])
    assert procs[0].argv == (sys.executable, "-m", "services.worker")
    assert [s.name for s in skipped] == (
        ["ghost"] if up.runnable("services.edge") else ["edge", "ghost"]
    )
