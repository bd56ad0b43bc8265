"""`sy up` as a child process for end-to-end tests: the steps of `make up` (MariaDB, the
demo databases, the tenants' walls), the fleet on ports of its own (so a developer's
fleet, or this machine's NATS on 4222, is untouched), ready when it says so, stopped with
SIGTERM as Ctrl-C would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from switchyard.ports import free_port
from tests.conftest import REPO
from tests.support.poll import until_blocking

SY = REPO / ".venv" / "bin" / "sy"
READY_TIMEOUT = 120.0  # s: the fleet's first llama.cpp loads on a shared 2-core machine
# The operator's own NATS settings would point the fleet elsewhere.
CLIENT_SETTINGS = ("SY_NATS_URL", "SY_NATS_USER", "SY_NATS_PASSWORD", "SY_NATS_NKEY_SEED_FILE",
                   "SY_NATS_CA", "SY_NATS_CERT", "SY_NATS_KEY")  # fmt: skip


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


class UpFleet:
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


def fleet_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_SETTINGS}
    env["PYTHONUNBUFFERED"] = "1"
    # The fleet's own Qdrant index: an embedded Qdrant allows one process per path.
    env["SY_KNOWLEDGE_INDEX"] = str(tmp / "knowledge-index")
    # The edge's silence limit (60 s) is for production; on a shared 2-core machine
    # under other tests' load the first llama.cpp answer can take longer.
    env["SY_IDLE_TIMEOUT"] = "150"
    return env


@contextlib.contextmanager
def sy_up(
    tmp: Path, *args: str, scheme: str = "http", env: Mapping[str, str] | None = None
) -> Iterator[UpFleet]:
    """`make up`'s steps, then `sy up <args>` (its children's settings `env` added) on free
    NATS and edge ports, until ready."""
    env = {**fleet_env(tmp), **(env or {})}
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
            [str(SY), "up", *args, "--nats", f"nats://127.0.0.1:{nats_port}",
             "--edge-port", str(edge_port), "--data-dir", str(tmp / "sy")],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    fleet = UpFleet(proc, log, tmp / "sy", f"{scheme}://127.0.0.1:{edge_port}")
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
