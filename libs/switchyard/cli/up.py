"""`sy up`: run the whole fleet on this machine, in the foreground.

It uses the NATS at the configured URL when it answers and otherwise starts an
embedded nats-server; provisions the topology; then runs every service of
`FLEET` whose package has a `__main__.py` as `python -m services.<name>`.

Nothing is restarted: a child that exits stops the fleet with a non-zero
status, so a crash is seen rather than hidden. Once the edge answers `/readyz`
it prints where the edge listens and a first request to try.

`--secure` runs the production NATS permissions locally: the embedded server
loads `compose/nats-auth.conf` (one user per service, each allowed exactly its
subjects), every child connects as its own user with a fresh random password,
and the operator's `admin` credentials are written to `<data dir>/nats/admin.env`.
SIGINT or SIGTERM stops the children (SIGTERM, then SIGKILL after `GRACE`
seconds) and the embedded nats-server last. Children and the server run in
their own sessions so a terminal's Ctrl-C reaches only this supervisor, which
stops them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import os
import re
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

import typer
from rich.console import Console
from rich.text import Text

from switchyard.bus.connection import connect
from switchyard.bus.provision import provision
from switchyard.bus.topology import Topology, TopologySettings, build_topology
from switchyard.config import Settings
from switchyard.errors import SwitchyardError
from switchyard.natsserver import EmbeddedNats, reachable

GRACE = 20.0
DATA_DIR = Path(".sy")
# The production users and permissions (compose/nats.conf includes the same file).
NATS_AUTH = Path("compose/nats-auth.conf")
ADMIN_USER = "admin"
EDGE_READY_TIMEOUT = 300.0  # s: the first llama.cpp load and the sqlflow index take a while
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})  # noqa: S104 - a URL, not a bind
COLORS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_green")

console = Console(soft_wrap=True, highlight=False)

Engine = Literal["llamacpp", "sim"]


@dataclass(frozen=True)
class Service:
    name: str
    module: str
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    # Its NATS user in compose/nats-auth.conf (used with `--secure`).
    nats_user: str = ""

    @property
    def user(self) -> str:
        return self.nats_user or self.name


# The edge's local dev key `sk-local-dev` -> tenant `dev` (http://127.0.0.1:8080/v1).
LOCAL_KEYS = "deploy/local/edge-keys.yaml"

# Started in this order (consumers before their producers), stopped all at once.
FLEET: tuple[Service, ...] = (
    Service("auditor", "services.auditor"),
    Service("executor", "services.executor"),
    Service("validator", "services.validator"),
    # One pool per workload: chat (`llm`), game-agent steps (`agent`), Text2SQL (`sql`).
    Service("worker", "services.worker", {"SY_POOL": "llm"}),
    Service("worker-agent", "services.worker", {"SY_POOL": "agent"}, nats_user="worker"),
    # A 4,096-token context: the SQL prompt carries schema text (SmolLM2 allows 8,192).
    Service(
        "worker-sql",
        "services.worker",
        {"SY_POOL": "sql", "SY_LLAMACPP_N_CTX": "4096"},
        nats_user="worker",
    ),
    Service("router", "services.router"),
    Service("sqlflow", "services.sqlflow"),
    Service("preprocessor", "services.preprocessor"),
    # Local dev key `sk-local-dev` -> tenant `dev`; http://127.0.0.1:8080/v1.
    Service("edge", "services.edge", {"SY_API_KEYS_FILE": LOCAL_KEYS, "SY_PORT": "8080"}),
)


@dataclass(frozen=True)
class Process:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    user: str = ""

    def describe(self) -> str:
        shown = {k: ("***" if "PASSWORD" in k else v) for k, v in self.env.items()}
        extra = "".join(f" {k}={v}" for k, v in shown.items())
        return f"python {' '.join(self.argv[1:])}{extra}"


def runnable(module: str) -> bool:
    """Whether `python -m <module>` can run: the package exists and has a `__main__`."""
    try:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    except ModuleNotFoundError:
        return False


def plan(
    fleet: tuple[Service, ...], *, workers: int, engine: Engine, edge_port: int = 8080
) -> tuple[list[Process], list[Service]]:
    """The processes to start, and the services skipped because they cannot run yet."""
    procs: list[Process] = []
    skipped: list[Service] = []
    for service in fleet:
        if not runnable(service.module):
            skipped.append(service)
            continue
        replicas, env = service.replicas, dict(service.env)
        if service.module == "services.worker":
            replicas, env = workers, {**env, "SY_ENGINE": engine}
        if service.module == "services.edge":
            env = {**env, "SY_PORT": str(edge_port)}
        for i in range(1, replicas + 1):
            name = service.name if replicas == 1 else f"{service.name}-{i}"
            argv = (sys.executable, "-m", service.module)
            procs.append(Process(name, argv, env, service.user))
    return procs, skipped


@dataclass(frozen=True)
class Credentials:
    """One random password per NATS user of compose/nats-auth.conf (`--secure`)."""

    passwords: dict[str, str]

    @classmethod
    def fresh(cls, users: set[str]) -> Credentials:
        # nats-server parses an environment value like config text: a leading digit would
        # read as a number, so each password is a letter and hex digits.
        return cls({u: "p" + secrets.token_hex(24) for u in sorted(users | {ADMIN_USER})})

    def server_env(self) -> dict[str, str]:
        """What nats-auth.conf's `$SY_NATS_PASSWORD_<USER>` references resolve to."""
        return {f"SY_NATS_PASSWORD_{u.upper()}": pw for u, pw in self.passwords.items()}

    def client_env(self, user: str) -> dict[str, str]:
        return {"SY_NATS_USER": user, "SY_NATS_PASSWORD": self.passwords[user]}


def auth_users() -> set[str]:
    """Every user NATS_AUTH declares (each needs its password variable set to start)."""
    if not NATS_AUTH.is_file():
        raise FileNotFoundError(f"{NATS_AUTH} not found: run `sy up` from the repository root")
    found = re.findall(r"\$SY_NATS_PASSWORD_([A-Z0-9_]+)", NATS_AUTH.read_text())
    return {name.lower() for name in found}


def secure(procs: list[Process], creds: Credentials) -> list[Process]:
    """Each process connects as its own NATS user."""
    return [Process(p.name, p.argv, {**p.env, **creds.client_env(p.user)}, p.user) for p in procs]


def edge_url(procs: list[Process]) -> str | None:
    for p in procs:
        if p.argv[-1] == "services.edge":
            return f"http://127.0.0.1:{p.env.get('SY_PORT', '8080')}"
    return None


def first_request(url: str) -> str:
    return (
        f"curl -s {url}/v1/chat/completions -H 'Authorization: Bearer sk-local-dev' "
        "-H 'Content-Type: application/json' "
        """-d '{"model":"default","messages":[{"role":"user","content":"Say hi"}],"""
        """"max_tokens":12}'"""
    )


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:  # noqa: S310 - ours
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


async def announce_edge(url: str, stop: asyncio.Event) -> None:
    """Print where the edge listens and a first request, once it says it is ready."""
    deadline = time.monotonic() + EDGE_READY_TIMEOUT
    while not stop.is_set() and time.monotonic() < deadline:
        if await asyncio.to_thread(_ready, url):
            status("edge", "green", "●", f"ready: {url}/v1 (OpenAI-compatible); try")
            console.print(f"  {first_request(url)}", markup=False)
            return
        await asyncio.sleep(1.0)
    if not stop.is_set():
        status("edge", "yellow", "●", f"{url}/readyz not ready after {EDGE_READY_TIMEOUT:.0f} s")


def _host_port(url: str) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname or "127.0.0.1", u.port or 4222


def start_nats(
    host: str, port: int, data_dir: Path, creds: Credentials | None = None
) -> EmbeddedNats:
    """An embedded nats-server; with `creds`, the production users of NATS_AUTH."""
    data_dir = data_dir.resolve()
    extra = ""
    if creds is not None:
        if not NATS_AUTH.is_file():
            raise FileNotFoundError(f"{NATS_AUTH} not found: run `sy up` from the repository root")
        data_dir.mkdir(parents=True, exist_ok=True)
        # nats-server resolves `include` relative to the config file, which lives here.
        (data_dir / NATS_AUTH.name).write_text(NATS_AUTH.read_text())
        extra = f"include ./{NATS_AUTH.name}"
    server = EmbeddedNats(
        data_dir=data_dir, host=host, port=port, new_session=True, extra_config=extra
    )
    # The server reads its users' passwords from its environment; children never see them.
    env = creds.server_env() if creds is not None else {}
    os.environ.update(env)
    try:
        return server.start()
    finally:
        for key in env:
            os.environ.pop(key, None)


def write_admin_env(path: Path, url: str, creds: Credentials) -> None:
    """The operator's credentials for `sy` commands against a `--secure` fleet (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"SY_NATS_URL={url}\n")
        for key, value in creds.client_env(ADMIN_USER).items():
            f.write(f"{key}={value}\n")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def status(name: str, color: str, mark: str, message: str) -> None:
    console.print(Text.assemble((f"{mark} ", color), (name, f"bold {color}"), f"  {message}"))


def describe(topology: Topology) -> str:
    return (
        f"streams {', '.join(s.name for s in topology.streams)}; "
        f"{len(topology.consumers)} consumers; {len(topology.buckets)} KV buckets"
    )


async def _quiet() -> None:
    """Closing our own short connection is not worth a warning."""


async def provision_fleet(url: str, creds: Credentials | None = None) -> str:
    auth: dict[str, Any] = {}
    if creds is not None:
        auth = {"nats_user": ADMIN_USER, "nats_password": creds.passwords[ADMIN_USER]}
    settings = TopologySettings(nats_url=url, **auth)
    bus = await asyncio.wait_for(connect(settings, "sy-up", disconnected_cb=_quiet), 30)
    try:
        changes = await provision(bus.js, build_topology(settings))
    finally:
        await bus.close()
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.action] = counts.get(change.action, 0) + 1
    return ", ".join(f"{n} {action}" for action, n in sorted(counts.items()))


async def pump(prefix: Text, stream: asyncio.StreamReader) -> None:
    """Copy a child's output line by line, prefixed with its name."""
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line over the reader's limit; it has been discarded
            console.print(prefix + Text("[line too long, dropped]", "dim"))
            continue
        if not line:
            return
        console.print(prefix + Text(line.decode(errors="replace").rstrip("\r\n")))


def _signal_group(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)  # the child leads its own session and process group


async def stop_children(
    children: dict[str, asyncio.subprocess.Process], color: dict[str, str]
) -> bool:
    """SIGTERM every live child, SIGKILL what is left after GRACE; False if anything was killed."""
    live = {n: c for n, c in children.items() if c.returncode is None}
    for child in live.values():
        _signal_group(child, signal.SIGTERM)
    waits = {n: asyncio.ensure_future(c.wait()) for n, c in live.items()}
    if waits:
        await asyncio.wait(waits.values(), timeout=GRACE)
    clean = True
    for name, child in live.items():
        if child.returncode is None:
            clean = False
            _signal_group(child, signal.SIGKILL)
            await child.wait()
            status(name, "red", "✗", f"killed after {GRACE:.0f} s without exiting")
        else:
            status(name, color[name], "■", f"stopped (exit {child.returncode})")
    return clean


async def supervise(procs: list[Process], url: str, nats: EmbeddedNats | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    width = max(len(p.name) for p in procs)
    color = {p.name: c for p, c in zip(procs, itertools.cycle(COLORS), strict=False)}
    children: dict[str, asyncio.subprocess.Process] = {}
    pumps: list[asyncio.Task[None]] = []
    announcer: asyncio.Task[None] | None = None
    code = 0
    try:
        for p in procs:
            env = {**os.environ, **p.env, "SY_NATS_URL": url, "PYTHONUNBUFFERED": "1"}
            child = await asyncio.create_subprocess_exec(
                *p.argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                limit=1024 * 1024,
            )
            children[p.name] = child
            status(p.name, color[p.name], "●", f"pid {child.pid}: {p.describe()}")
            assert child.stdout is not None
            prefix = Text(f"{p.name:<{width}} │ ", color[p.name])
            pumps.append(asyncio.create_task(pump(prefix, child.stdout)))
        edge = edge_url(procs)
        if edge is not None:
            announcer = asyncio.create_task(announce_edge(edge, stop))
        exits = {asyncio.ensure_future(c.wait()): n for n, c in children.items()}
        stopping = asyncio.ensure_future(stop.wait())
        while not stop.is_set():
            done, _ = await asyncio.wait(
                [stopping, *exits], timeout=0.5, return_when=asyncio.FIRST_COMPLETED
            )
            dead = [exits[t] for t in done if t in exits]
            if dead:
                for name in dead:
                    rc = children[name].returncode
                    status(name, "red", "✗", f"exited with {rc}; stopping the fleet")
                code = 1
                break
            if nats is not None and nats.proc is not None and nats.proc.poll() is not None:
                rc = nats.proc.returncode
                status("nats", "red", "✗", f"nats-server exited with {rc}; stopping the fleet")
                code = 1
                break
        if stop.is_set():
            console.print(f"stopping the fleet (SIGTERM, then SIGKILL after {GRACE:.0f} s)")
        stopping.cancel()
    finally:
        if announcer is not None:
            announcer.cancel()
        if not await stop_children(children, color):
            code = code or 1
        if pumps:
            await asyncio.wait(pumps, timeout=2)
    return code


def register(app: typer.Typer) -> None:
    @app.command()
    def up(
        nats_url: Annotated[
            str | None, typer.Option("--nats", help="NATS URL (default: SY_NATS_URL or localhost)")
        ] = None,
        workers: Annotated[int, typer.Option(min=1, help="worker replicas")] = 1,
        engine: Annotated[
            Engine, typer.Option(help="inference engine of the workers")
        ] = "llamacpp",
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="print what would start, start nothing")
        ] = False,
        edge_port: Annotated[
            int, typer.Option(min=1, max=65535, help="the edge's HTTP port")
        ] = 8080,
        data_dir: Annotated[
            Path, typer.Option(help="state of the embedded nats-server (<dir>/nats)")
        ] = DATA_DIR,
        secure_users: Annotated[
            bool,
            typer.Option(
                "--secure",
                help=f"embedded NATS with the per-service users of {NATS_AUTH}",
            ),
        ] = False,
    ) -> None:
        """Run the fleet locally: NATS (embedded unless reachable), topology, every service."""
        url = nats_url or Settings().nats_url
        host, port = _host_port(url)
        external = reachable(host, port)
        procs, skipped = plan(FLEET, workers=workers, engine=engine, edge_port=edge_port)
        topology = build_topology(TopologySettings(nats_url=url))
        nats_dir = data_dir / "nats"
        creds: Credentials | None = None
        if secure_users:
            if external:
                status("nats", "red", "✗", f"--secure needs its own nats-server: {url} is taken")
                raise typer.Exit(1)
            creds = Credentials.fresh(auth_users() | {p.user for p in procs})
            procs = secure(procs, creds)

        if external:
            status("nats", "green", "●", f"{url} is reachable: using it")
        elif host in LOCAL_HOSTS:
            verb = "would start" if dry_run else "starting"
            users = f", users of {NATS_AUTH}" if creds is not None else ""
            what = f"an embedded nats-server on {host}:{port}, store {nats_dir}/{users}"
            status("nats", "yellow", "●", f"{url} is not reachable: {verb} {what}")
        else:
            status("nats", "red", "✗", f"{url} is not reachable and not local; start it first")
            raise typer.Exit(1)
        for service in skipped:
            status(service.name, "dim", "-", f"skipped: {service.module} has no __main__.py yet")
        if dry_run:
            console.print(f"would provision {describe(topology)}")
            for p in procs:
                console.print(f"would start {p.name}: {p.describe()}")
            if not procs:
                console.print("no service can run yet: nothing else would start")
            return

        server: EmbeddedNats | None = None
        code = 0
        # Unwind on SIGTERM too, stopping what was started (asyncio.run installs its own).
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            if not external:
                server = start_nats(host, port, nats_dir, creds)
                where = f"on {server.url}, log {nats_dir}/nats.log"
                status("nats", "green", "●", f"embedded nats-server {where}")
            if creds is not None:
                admin = nats_dir / "admin.env"
                write_admin_env(admin, url, creds)
                status("nats", "green", "●", f"per-service users; operator credentials in {admin}")
            summary = asyncio.run(provision_fleet(url, creds))
            status("provision", "green", "●", f"{describe(topology)}: {summary}")
            if procs:
                code = asyncio.run(supervise(procs, url, server))
            elif server is not None:
                console.print("no service can run yet; the embedded NATS stays up until Ctrl-C")
                with contextlib.suppress(KeyboardInterrupt):
                    assert server.proc is not None
                    server.proc.wait()
                if server.proc is not None and server.proc.returncode is not None:
                    code = 1
            else:
                console.print("no service can run yet: nothing to supervise")
        except KeyboardInterrupt:
            code = 130
        except (OSError, RuntimeError, SwitchyardError) as exc:  # no traceback for the expected
            status("up", "red", "✗", f"{type(exc).__name__}: {exc}")
            code = 1
        finally:
            if server is not None:
                server.stop()
                status("nats", "dim", "■", "embedded nats-server stopped")
            signal.signal(signal.SIGTERM, previous)
        raise typer.Exit(code)
