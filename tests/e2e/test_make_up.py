"""`make up`, end to end: the whole local fleet as processes, then real clients against it.

The same steps as the Makefile's `up` target (ensure MariaDB, `sy sql demo-db`,
`sy sql provision`, `sy up`), with `sy up` on ports of its own so a developer's
fleet (or this machine's NATS on 4222) is untouched, and with `--secure`: the
embedded nats-server loads the production users of compose/nats-auth.conf, so
every service runs with exactly its production permissions. Then, against it:
the first request `sy up` prints (a chat completion on the edge), a short
`sy agent-sim` and `sy sql ask -t acme ...`; then SIGTERM stops everything.
The server log must hold no permissions violation.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from switchyard.ports import free_port
from tests.conftest import REPO
from tests.support.poll import until_blocking

pytestmark = pytest.mark.timeout(240)

SY = REPO / ".venv" / "bin" / "sy"
READY_TIMEOUT = 120.0  # s: the fleet's first llama.cpp loads on a shared 2-core machine


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}


class Fleet:
    def __init__(self, proc: subprocess.Popen[str], log: Path, data: Path, edge: str) -> None:
        self.proc, self.log, self.data, self.edge = proc, log, data, edge

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        """Whether `sy up` printed that its fleet is ready (it waits on the fleet's
        readiness, not a delay) and the first request to try, which it writes after the
        edge's ready line; fails the test at once if it exited."""
        if self.proc.poll() is not None:
            pytest.fail(f"sy up exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
        out = self.output()
        return "ready: http" in out and "/v1/chat/completions" in out.split("ready: http", 1)[1]

    def wait_ready(self) -> None:
        try:
            until_blocking(self.ready, timeout=READY_TIMEOUT, what="sy up ready")
        except TimeoutError as exc:
            pytest.fail(f"{exc}:\n{self.output()[-4000:]}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("make-up")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in (
        "SY_NATS_URL",
        "SY_NATS_USER",
        "SY_NATS_PASSWORD",
        "SY_NATS_NKEY_SEED_FILE",
        "SY_NATS_CA",
        "SY_NATS_CERT",
        "SY_NATS_KEY",
    ):
        env.pop(key, None)
    # The fleet's own Qdrant index: an embedded Qdrant allows one process per path.
    env["SY_KNOWLEDGE_INDEX"] = str(tmp / "knowledge-index")
    # The edge's silence limit (60 s) is for production; on a shared 2-core machine
    # under other tests' load the first llama.cpp answer can take longer.
    env["SY_IDLE_TIMEOUT"] = "150"
    for step in (
        ["bash", "deploy/local/ensure-mariadb.sh"],
        [str(SY), "sql", "demo-db"],
        [str(SY), "sql", "provision", "--tenant", "acme", "--tenant", "nova"],
    ):
        done = run(step, env, timeout=150)
        assert done.returncode == 0, f"{step}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    nats_port, edge_port = free_port(), free_port()
    log = tmp / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(SY), "up", "--secure", "--nats", f"nats://127.0.0.1:{nats_port}",
             "--edge-port", str(edge_port), "--data-dir", str(tmp / "sy")],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    # `--secure`: the edge serves HTTPS with the certificate of the CA `sy up` made.
    fleet = Fleet(proc, log, tmp / "sy", f"https://127.0.0.1:{edge_port}")
    try:
        fleet.wait_ready()
        yield fleet
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def client_env(fleet: Fleet) -> dict[str, str]:
    """The operator's credentials `sy up --secure` wrote (user admin)."""
    creds = read_env_file(fleet.data / "nats" / "admin.env")
    assert creds["SY_NATS_USER"] == "admin"
    return {**os.environ, **creds}


def test_up_prints_where_the_edge_listens_and_a_first_request(fleet: Fleet) -> None:
    out = fleet.output()
    assert f"ready: {fleet.edge}/v1" in out
    ca = (fleet.data / "nats" / "tls" / "ca.crt").resolve()
    first = re.search(r"curl -s --cacert (\S+) (\S+)/v1/chat/completions", out)
    assert first is not None and (first.group(1), first.group(2)) == (str(ca), fleet.edge)
    assert "per-service users" in out
    reply = httpx.post(
        f"{fleet.edge}/v1/chat/completions",
        headers={"Authorization": "Bearer sk-local-dev"},
        json={"model": "default", "messages": [{"role": "user", "content": "Say hi"}],
              "max_tokens": 8},
        timeout=150, verify=ssl.create_default_context(cafile=str(ca)),
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None


def test_agent_sim_against_the_fleet(fleet: Fleet) -> None:
    done = run(
        [str(SY), "agent-sim", "--nats", read_env_file(fleet.data / "nats" / "admin.env")[
            "SY_NATS_URL"], "--phones", "1", "--steps", "2", "--resolution", "320x240", "--json"],
        client_env(fleet), timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["steps"], report["ok"], report["errors"]) == (2, 2, {}), report


def test_sql_ask_against_the_fleet(fleet: Fleet) -> None:
    url = read_env_file(fleet.data / "nats" / "admin.env")["SY_NATS_URL"]
    done = run(
        [str(SY), "sql", "ask", "--nats", url, "-t", "acme", "--json",
         "How many players registered yesterday?"],
        client_env(fleet), timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["status"] == "ok", answer
    assert answer["tenant"] == "acme"


def test_no_service_was_refused_a_subject(fleet: Fleet) -> None:
    log = (fleet.data / "nats" / "nats.log").read_text(errors="replace")
    assert "Violation" not in log, [line for line in log.splitlines() if "Violation" in line]
