"""What is started is stopped (issue #36): `sy up` and `sy agent-sim --search`, signalled
mid-run as a terminal or a process manager would, leave no process of theirs alive.

SIGINT, SIGTERM and SIGHUP each stop a launcher and everything it started (children in
sessions of their own, `nats-server` included) within 15 s; a second signal kills at
once. A service whose NATS is gone exits within 10 s of SIGTERM, although it holds a
request it can no longer answer (its drain is bounded: `switchyard.service`).

Each launcher runs as `sy` does from a shell: its own console script, in a process group
of its own, signalled as a whole group (a terminal's Ctrl-C reaches its whole foreground
group) or alone (a `kill PID`, a supervisor).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from switchyard.bus.connection import connect
from switchyard.bus.publish import publish
from switchyard.config import Settings
from switchyard.messages.inference import ChatMessage, GenerateRequest, Sampling
from switchyard.natsserver import EmbeddedNats
from switchyard.ports import free_port
from tests.conftest import REPO
from tests.support.descendants import Descendants
from tests.support.fleet import provision_pool, service_process, work_subject
from tests.support.poll import until, until_blocking

pytestmark = pytest.mark.timeout(240)

SY = REPO / ".venv" / "bin" / "sy"
STOPPED_WITHIN = 15.0  # s: the bound, from the (first) signal to nothing left
KILLED_WITHIN = 5.0  # s: after a second signal


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in [k for k in env if k.startswith("SY_NATS_")]:
        env.pop(key)
    env["SY_KNOWLEDGE_INDEX"] = str(tmp / "knowledge-index")  # one process per index path
    return env


class Launcher:
    def __init__(self, argv: list[str], tmp: Path) -> None:
        self.log = tmp / "launcher.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=_env(tmp), stdout=out, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )  # fmt: skip
        self.family = Descendants(self.proc)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 150.0) -> None:
        def there() -> bool:
            self.family.scan()
            if self.proc.poll() is not None:
                pytest.fail(f"exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            return text in self.output()

        until_blocking(there, timeout=timeout, what=repr(text))

    def signal(self, sig: signal.Signals, *, group: bool) -> None:
        self.family.scan()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[list[Launcher]]:
    started: list[Launcher] = []
    yield started
    for launcher in started:  # a failed test leaves nothing running either
        launcher.family.kill_all()


def sy_up(tmp: Path) -> list[str]:
    return [str(SY), "up", "--engine", "sim", "--nats", f"nats://127.0.0.1:{free_port()}",
            "--edge-port", str(free_port()), "--data-dir", str(tmp / "sy")]  # fmt: skip


@pytest.mark.parametrize(
    ("signals", "group"),
    [
        (["SIGINT"], True),  # Ctrl-C in a terminal
        (["SIGTERM"], False),  # kill PID, a process manager
        (["SIGHUP"], False),  # the terminal closed
        (["SIGINT", "SIGINT"], True),  # Ctrl-C twice: no waiting for the drain
    ],
)
def test_sy_up_leaves_nothing_running(
    signals: list[str], group: bool, tmp_path: Path, launched: list[Launcher]
) -> None:
    up = Launcher(sy_up(tmp_path), tmp_path)
    launched.append(up)
    up.wait_for("ready: http")
    assert up.family.scan() >= 10, up.family.seen  # nats-server and the fleet's services
    up.signal(signal.Signals[signals[0]], group=group)
    if len(signals) > 1:
        time.sleep(0.5)  # the fleet is draining
        up.signal(signal.Signals[signals[1]], group=group)
        took = up.family.wait_gone(KILLED_WITHIN)
        assert "again: killed what was still running" in up.output()
    else:
        took = up.family.wait_gone(STOPPED_WITHIN)
        assert "embedded nats-server stopped" in up.output()
    assert up.proc.returncode is not None and took < STOPPED_WITHIN


# A target every load meets: the search climbs the whole ladder unless it is stopped.
SEARCH = [
    "agent-sim", "--engine", "sim", "--search", "--steps", "6", "--loads", "1,2,3,4,5,6,7,8",
    "--target-ms", "60000", "--min-loop-efficiency", "0", "--json",
]  # fmt: skip


@pytest.mark.parametrize(("sig", "group"), [("SIGINT", True), ("SIGTERM", False)])
def test_agent_sim_search_stops_the_whole_search(
    sig: str, group: bool, tmp_path: Path, launched: list[Launcher]
) -> None:
    search = Launcher([str(SY), *SEARCH], tmp_path)
    launched.append(search)
    # The first load measured: the search is between fleets, or on its second one.
    search.wait_for("agent-sim search: 1 phones")
    time.sleep(3.0)
    points = search.output().count("agent-sim search:")
    search.signal(signal.Signals[sig], group=group)
    search.family.wait_gone(STOPPED_WITHIN)
    assert search.proc.returncode == 130, search.output()[-2000:]
    # It stopped the search, not only the load it was on.
    assert search.output().count("agent-sim search:") <= points + 1, search.output()[-2000:]


async def test_a_service_whose_bus_is_gone_exits_soon_after_sigterm(tmp_path: Path) -> None:
    """A worker generates (a slow sim answer); its NATS is killed; SIGTERM. It can neither
    answer nor ack what it holds (the stream hands it to another worker), so it must not
    wait out its drain (30 s) and then its result's publish patience (30 s)."""
    pool, tenant = "signals", "t-signals"
    with EmbeddedNats(data_dir=tmp_path / "nats") as nats:
        bus = await connect(Settings(nats_url=nats.url), "test-signals")
        await provision_pool(bus.js, pool)
        env = {"SY_ENGINE": "sim", "SY_POOL": pool, "SY_ASSIGNMENT": "static",
               "SY_PARTITIONS": "4", "SY_SIM_DELAY_SCALE": "20"}  # fmt: skip
        with service_process("worker", nats.url, **env) as worker:
            await until(lambda: "worker.ready" in worker.output(), timeout=60, what="ready")
            req = GenerateRequest(
                tenant=tenant, workload="llm", pool=pool, session="s1",
                messages=[ChatMessage(role="user", content="a long answer")],
                sampling=Sampling(max_tokens=400, temperature=0.0, seed=1),
            )  # fmt: skip
            deltas: list[Msg] = []

            async def on_frame(msg: Msg) -> None:
                deltas.append(msg)

            inbox = bus.nc.new_inbox()
            await bus.nc.subscribe(inbox, cb=on_frame)
            await publish(bus.js, work_subject(req), req.model_copy(update={"reply": inbox}))
            await until(lambda: bool(deltas), timeout=60, what="the worker generating")
            await bus.nc.close()
            nats.kill()
            started = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.proc.wait, 40)
            took = time.monotonic() - started
            output = worker.output()
    assert took < 10.0, (took, output[-3000:])
    assert "service.drain_abandoned" in output, output[-3000:]
