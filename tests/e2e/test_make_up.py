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
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.upfleet import SY, UpFleet, run, sy_up

pytestmark = pytest.mark.timeout(240)


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpFleet]:
    # `--secure`: the edge serves HTTPS with the certificate of the CA `sy up` made.
    with sy_up(tmp_path_factory.mktemp("make-up"), "--secure", scheme="https") as fleet:
        yield fleet


def client_env(fleet: UpFleet) -> dict[str, str]:
    """The operator's credentials `sy up --secure` wrote (user admin)."""
    creds = read_env_file(fleet.data / "nats" / "admin.env")
    assert creds["SY_NATS_USER"] == "admin"
    return {**os.environ, **creds}


def test_up_prints_where_the_edge_listens_and_a_first_request(fleet: UpFleet) -> None:
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


def test_agent_sim_against_the_fleet(fleet: UpFleet) -> None:
    done = run(
        [str(SY), "agent-sim", "--nats", read_env_file(fleet.data / "nats" / "admin.env")[
            "SY_NATS_URL"], "--phones", "1", "--steps", "2", "--resolution", "320x240", "--json"],
        client_env(fleet), timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["steps"], report["ok"], report["errors"]) == (2, 2, {}), report


def test_sql_ask_against_the_fleet(fleet: UpFleet) -> None:
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


def test_no_service_was_refused_a_subject(fleet: UpFleet) -> None:
    log = (fleet.data / "nats" / "nats.log").read_text(errors="replace")
    assert "Violation" not in log, [line for line in log.splitlines() if "Violation" in line]
