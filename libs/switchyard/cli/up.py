"""`sy up`: run the whole fleet on this machine, in the foreground.

It uses the NATS at the configured URL when it answers and otherwise starts an
embedded nats-server; then `switchyard.fleet.launch` provisions the topology and
runs every service of `FLEET` whose package has a `__main__.py` as
`python -m services.<name>`.

Nothing is restarted: a child that exits stops the fleet with a non-zero
status, so a crash is seen rather than hidden. Once the fleet is ready (every
partition of every pool bound by a live worker, the edge answering `/readyz`)
it prints one line for the start-up, where the edge listens and a first request
to try. The children's JSON logs are shown as they are, or rendered for a person
on a terminal (`--log-format`, `switchyard.cli.logview`).

`--secure` runs NATS as production does, locally: the embedded server speaks only
TLS and wants a client certificate (routes too, with `--nats-cluster`), and loads
`compose/nats-auth.conf` (one nkey user per service, each allowed exactly its
subjects); every child connects with its own nkey and certificate, made by a
throwaway CA under `<data dir>/nats/` (`LocalSecrets`), and the operator's `admin`
settings are written to `<data dir>/nats/admin.env`.
SIGINT or SIGTERM stops the children (SIGTERM, then SIGKILL after `GRACE`
seconds) and the embedded nats-server last. Children and the server run in
their own sessions so a terminal's Ctrl-C reaches only this supervisor, which
stops them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.text import Text

from switchyard import children
from switchyard.bus.provision import Change
from switchyard.bus.topology import Topology, TopologySettings, build_topology
from switchyard.cli.logview import LogFormat, LogView, pretty
from switchyard.cli.scrape import with_metrics_ports, write_prometheus_config
from switchyard.config import Settings
from switchyard.errors import SwitchyardError
from switchyard.fleet import Fleet, FleetError, NotReady, PoolReady, Roster, Service, launch
from switchyard.fleet.bus import any_reachable, host_port
from switchyard.fleet.spec import env_of, role_split
from switchyard.identity import Identity
from switchyard.messages.fleet import WorkerRole
from switchyard.natsserver import EmbeddedCluster, EmbeddedNats, tls_block
from switchyard.pki import CertFiles, LocalCA

GRACE = 20.0
DATA_DIR = Path(".sy")
# The production users and permissions (compose/nats.conf includes the same file).
NATS_AUTH = Path("compose/nats-auth.conf")
ADMIN_USER = "admin"
# The route certificate's common name, what compose/nats-cluster.conf admits as a route.
ROUTE_USER = "switchyard-nats-route"
READY_TIMEOUT = 300.0  # s: the first llama.cpp loads and the sqlflow index take a while
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})  # noqa: S104 - a URL, not a bind

console = Console(soft_wrap=True, highlight=False)

Engine = Literal["llamacpp", "sim"]

# The edge's local dev key `sk-local-dev` -> tenant `dev` (http://127.0.0.1:8080/v1).
LOCAL_KEYS = "deploy/local/edge-keys.yaml"

# Started in this order (consumers before their producers), stopped all at once. A
# service's `nats_user` is its user in compose/nats-auth.conf (`--secure`), its name if unset.
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


def runnable(module: str) -> bool:
    """Whether `python -m <module>` can run: the package exists and has a `__main__`."""
    try:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    except ModuleNotFoundError:
        return False


def plan(
    fleet: tuple[Service, ...], *, workers: int, engine: Engine, edge_port: int = 8080,
    agent_roles: tuple[WorkerRole, ...] = (),
) -> tuple[list[Service], list[Service]]:  # fmt: skip
    """The processes to start (`workers` replicas of each worker; the agent pool's one per
    role of `agent_roles` when given, #39), and the services skipped because they cannot
    run yet."""
    procs: list[Service] = []
    skipped: list[Service] = []
    for service in fleet:
        if not runnable(service.module):
            skipped.append(service)
            continue
        replicas, env = 1, dict(service.env)
        roles: tuple[WorkerRole, ...] = ()
        if service.kind == "worker":
            replicas, env = workers, {**env, "SY_ENGINE": engine}
            if agent_roles and env.get("SY_POOL") == "agent":
                replicas, roles = len(agent_roles), agent_roles
        if service.kind == "edge":
            env = {**env, "SY_PORT": str(edge_port)}
        for i in range(1, replicas + 1):
            name = service.name if replicas == 1 else f"{service.name}-{i}"
            own = {**env, "SY_WORKER_ROLE": roles[i - 1]} if roles else env
            procs.append(Service(name, service.module, own, service.nats_user or service.name))
    return procs, skipped


def roster(procs: list[Service], edge_ca: Path | None = None) -> Roster:
    """What `launch` starts and waits for: every pool's workers, the edge's `/readyz`
    (over HTTPS trusting `edge_ca`, when the edge has a certificate)."""
    partitions = Settings().partitions  # the children read the same SY_PARTITIONS
    routed = any(p.kind == "router" for p in procs)
    workers = Counter(p.env["SY_POOL"] for p in procs if p.kind == "worker" and "SY_POOL" in p.env)
    pools = tuple(PoolReady(pool, n, partitions, routed) for pool, n in workers.items())
    return Roster(tuple(procs), pools, partitions, edge_url(procs), edge_ca)


@dataclass(frozen=True)
class LocalSecrets:
    """`--secure`: what a deployment's secrets hold, made on this machine (local only).

    Under `<data dir>/nats/`: a throwaway CA (`tls/`, reused while it is valid), the
    server's and the routes' certificates, and per NATS user of compose/nats-auth.conf an
    nkey seed (`nkeys/`, reused) and a client certificate. The server sees public keys
    only; each child gets the paths of its own seed and certificate.
    """

    ca: LocalCA
    server: CertFiles
    route: CertFiles
    identities: dict[str, Identity]
    clients: dict[str, CertFiles]

    @classmethod
    def make(cls, directory: Path, users: set[str], host: str) -> LocalSecrets:
        # Absolute: the server's config and the children (another cwd, perhaps) name them.
        directory = directory.resolve()
        ca = LocalCA.ensure(directory / "tls")
        names = sorted(users | {ADMIN_USER})
        return cls(
            ca=ca,
            server=ca.issue("server", hosts=[host], server=True),
            route=ca.issue(ROUTE_USER, hosts=[host], server=True, client=True, stem="route"),
            identities={u: Identity.ensure(directory / "nkeys", u) for u in names},
            clients={u: ca.issue(u, client=True) for u in names},
        )

    def server_env(self) -> dict[str, str]:
        """What nats-auth.conf's `$SY_NATS_NKEY_<USER>` references resolve to."""
        env: dict[str, str] = {}
        for identity in self.identities.values():
            env |= identity.server_env()
        return env

    def client_settings(self, user: str) -> dict[str, Any]:
        """`user`'s Settings fields: its identity and TLS files (paths, no secret inside)."""
        cert = self.clients[user]
        return {
            "nats_user": user, "nats_nkey_seed_file": self.identities[user].seed_file,
            "nats_ca": self.ca.cert, "nats_cert": cert.cert, "nats_key": cert.key,
        }  # fmt: skip

    def client_env(self, user: str) -> dict[str, str]:
        return env_of(**self.client_settings(user))

    def server_config(self) -> str:
        """The production config's TLS (compose/nats.conf) and users (NATS_AUTH)."""
        tls = tls_block(self.server.cert, self.server.key, self.ca.cert)
        return f"{tls}include ./{NATS_AUTH.name}\n"

    def route_config(self) -> str:
        """compose/nats-cluster.conf's route TLS: only the route certificate opens a route."""
        tls = tls_block(
            self.route.cert, self.route.key, self.ca.cert, verify="verify_and_map", indent=4
        )
        return f'{tls}    authorization {{ user: "CN={ROUTE_USER}" }}\n'


def auth_users() -> set[str]:
    """Every user NATS_AUTH declares (each needs its public nkey variable set to start)."""
    if not NATS_AUTH.is_file():
        raise FileNotFoundError(f"{NATS_AUTH} not found: run `sy up` from the repository root")
    found = re.findall(r"\$SY_NATS_NKEY_([A-Z0-9_]+)", NATS_AUTH.read_text())
    return {name.lower() for name in found}


def secure(procs: list[Service], secrets: LocalSecrets) -> list[Service]:
    """Each process connects over TLS as its own NATS user; the edge serves HTTPS with the
    server certificate (it names localhost and 127.0.0.1)."""
    https = env_of(https_cert=secrets.server.cert, https_key=secrets.server.key)
    out = []
    for p in procs:
        env = {**p.env, **secrets.client_env(p.nats_user)}
        out.append(dataclasses.replace(p, env={**env, **https} if p.kind == "edge" else env))
    return out


def edge_url(procs: list[Service]) -> str | None:
    for p in procs:
        if p.kind == "edge":
            scheme = "https" if "SY_HTTPS_CERT" in p.env else "http"
            return f"{scheme}://127.0.0.1:{p.env.get('SY_PORT', '8080')}"
    return None


def first_request(url: str, ca: Path | None = None) -> str:
    trust = f"--cacert {ca} " if ca is not None else ""
    return (
        f"curl -s {trust}{url}/v1/chat/completions -H 'Authorization: Bearer sk-local-dev' "
        "-H 'Content-Type: application/json' "
        """-d '{"model":"default","messages":[{"role":"user","content":"Say hi"}],"""
        """"max_tokens":12}'"""
    )


def start_nats(
    host: str, port: int, data_dir: Path, secrets: LocalSecrets | None = None, cluster: int = 1
) -> list[EmbeddedNats]:
    """An embedded nats-server, or `cluster` of them as one JetStream cluster on ports
    `port`, `port+1`...; with `secrets`, TLS (routes too) and the production users of
    NATS_AUTH on each."""
    data_dir = data_dir.resolve()
    extra = routes = ""
    if secrets is not None:
        if not NATS_AUTH.is_file():
            raise FileNotFoundError(f"{NATS_AUTH} not found: run `sy up` from the repository root")
        extra, routes = secrets.server_config(), secrets.route_config()
    if cluster > 1:
        group = EmbeddedCluster(
            data_dir, cluster, host=host, extra_config=extra, cluster_config=routes,
            new_session=True, ports=tuple(range(port, port + cluster)),
        )  # fmt: skip
        servers = group.servers
    else:
        servers = [EmbeddedNats(data_dir=data_dir, host=host, port=port, new_session=True,
                                extra_config=extra)]  # fmt: skip
    if secrets is not None:
        for server in servers:
            # nats-server resolves `include` relative to the config file, which lives here.
            server.data_dir.mkdir(parents=True, exist_ok=True)
            (server.data_dir / NATS_AUTH.name).write_text(NATS_AUTH.read_text())
    # The server reads its users' public keys from its environment.
    env = secrets.server_env() if secrets is not None else {}
    os.environ.update(env)
    try:
        if cluster > 1:
            group.start()
        else:
            servers[0].start()
        return servers
    finally:
        for key in env:
            os.environ.pop(key, None)


def write_admin_env(path: Path, url: str, secrets: LocalSecrets) -> None:
    """The operator's settings for `sy` commands against a `--secure` fleet: paths to the
    admin's seed and certificate, no secret itself (mode 0600 all the same)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"SY_NATS_URL={url}\n")
        for key, value in secrets.client_env(ADMIN_USER).items():
            f.write(f"{key}={value}\n")


def status(name: str, color: str, mark: str, message: str) -> None:
    console.print(Text.assemble((f"{mark} ", color), (name, f"bold {color}"), f"  {message}"))


def describe(topology: Topology) -> str:
    return (
        f"streams {', '.join(s.name for s in topology.streams)}; "
        f"{len(topology.consumers)} consumers; {len(topology.buckets)} KV buckets"
    )


def changes(provisioned: list[Change]) -> str:
    counts = Counter(change.action for change in provisioned)
    return ", ".join(f"{n} {action}" for action, n in sorted(counts.items()))


async def announce(fleet: Fleet, view: LogView) -> None:
    """Once the fleet is ready, one line for the start-up (instead of one per partition
    move), then where the edge listens and a first request to try."""
    try:
        pools = await fleet.wait_ready(READY_TIMEOUT)
    except NotReady as exc:
        held = view.started()
        status("fleet", "yellow", "●", str(exc) + (f" (held back: {held})" if held else ""))
        return
    except FleetError:  # a service exited: the supervisor says so and stops the fleet
        return
    except Exception as exc:  # e.g. NATS refused our own connection: say so, keep running
        status("fleet", "yellow", "●", f"could not tell whether it is ready: {exc}")
        return
    held = view.started()
    served = "; ".join(pool.describe() for pool in pools) or "no worker pools"
    status("fleet", "green", "●", f"ready: {served}" + (f" (not shown: {held})" if held else ""))
    if fleet.edge_url is not None:
        status("edge", "green", "●", f"ready: {fleet.edge_url}/v1 (OpenAI-compatible); try")
        console.print(f"  {first_request(fleet.edge_url, fleet.roster.edge_ca)}", markup=False)


async def supervise(
    procs: list[Service], url: str, nats: list[EmbeddedNats], secrets: LocalSecrets | None,
    log_format: LogFormat,
) -> int:  # fmt: skip
    """Run `procs` until Ctrl-C/SIGTERM/SIGHUP or one of them exits; the exit status. A
    second signal while the fleet drains kills it at once (`children.stopping_on`)."""
    stop = asyncio.Event()
    with children.stopping_on(asyncio.get_running_loop(), stop.set):
        return await _supervise(procs, url, nats, secrets, log_format, stop)


async def _supervise(
    procs: list[Service], url: str, nats: list[EmbeddedNats], secrets: LocalSecrets | None,
    log_format: LogFormat, stop: asyncio.Event,
) -> int:  # fmt: skip
    view = LogView(console, [p.name for p in procs], pretty=pretty(log_format, console.is_terminal))
    admin = secrets.client_settings(ADMIN_USER) if secrets is not None else None
    edge_ca = secrets.ca.cert if secrets is not None else None
    topology = describe(build_topology(TopologySettings(nats_url=url)))
    code = 0
    exited: set[str] = set()  # reported when they exited, not again when the rest stops
    async with launch(
        roster(procs, edge_ca), nats_url=url, nats_identity=admin, on_output=view.line,
        ready_timeout=None,
        grace=GRACE,
    ) as fleet:  # fmt: skip
        status("provision", "green", "●", f"{topology}: {changes(fleet.provisioned)}")
        if not procs and not nats:
            console.print("no service can run yet: nothing to supervise")
            return code
        if not procs:
            console.print("no service can run yet; the embedded NATS stays up until Ctrl-C")
        started = fleet.processes.children if fleet.processes is not None else []
        for p, child in zip(procs, started, strict=True):
            status(p.name, view.color(p.name), "●", f"pid {child.pid}: {p.describe()}")
        announcer = asyncio.create_task(announce(fleet, view))
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                dead = [c for c in started if not c.alive()]
                for child in dead:
                    exited.add(child.name)
                    rc = child.proc.returncode
                    status(child.name, "red", "✗", f"exited with {rc}; stopping the fleet")
                if dead:
                    code = 1
                    break
                # A cluster's member may go (the fleet rides it out); the last one may not.
                for server in nats:
                    if server.name not in exited and not server.running:
                        exited.add(server.name)
                        status("nats", "yellow", "●", f"nats-server {server.name} exited")
                if nats and not any(server.running for server in nats):
                    status("nats", "red", "✗", "no nats-server is left; stopping the fleet")
                    code = 1
                    break
            if stop.is_set():
                console.print(f"stopping the fleet (SIGTERM, then SIGKILL after {GRACE:.0f} s)")
        finally:
            announcer.cancel()
            for stopped in await fleet.stop():
                if stopped.killed:
                    code = code or 1
                    status(stopped.name, "red", "✗", f"killed after {GRACE:.0f} s without exiting")
                elif stopped.name not in exited:
                    mark = f"stopped (exit {stopped.returncode})"
                    status(stopped.name, view.color(stopped.name), "■", mark)
    return code


def register(app: typer.Typer) -> None:
    @app.command()
    def up(
        nats_url: Annotated[
            str | None, typer.Option("--nats", help="NATS URL (default: SY_NATS_URL or localhost)")
        ] = None,
        workers: Annotated[int, typer.Option(min=1, help="worker replicas")] = 1,
        roles: Annotated[
            str | None,
            typer.Option(
                help="the agent pool's workers by role, e.g. 6p2d: 6 prefill then 2 decode "
                "workers (a disaggregated pool); default --workers of role both"
            ),
        ] = None,
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
        nats_cluster: Annotated[
            int,
            typer.Option(
                "--nats-cluster",
                min=1,
                max=7,
                help="embedded NATS as a JetStream cluster of N servers (ports from --nats's "
                "port up), streams and buckets with min(N, 3) replicas",
            ),
        ] = 1,
        secure_users: Annotated[
            bool,
            typer.Option(
                "--secure",
                help=f"embedded NATS as in production: TLS (client certificates, TLS "
                f"routes) and the per-service nkey users of {NATS_AUTH}, with a throwaway "
                "CA and keys under --data-dir",
            ),
        ] = False,
        metrics_ports: Annotated[
            int,
            typer.Option(
                "--metrics-ports",
                min=0,
                max=65000,
                help="every service serves /metrics on this base port's convention "
                "(deploy/prometheus/prometheus.yml: preprocessor +1, router +2, ..., workers "
                "+10 on), and <data dir>/prometheus/prometheus.yml scrapes them; 0: only "
                "the edge's /metrics",
            ),
        ] = 0,
        log_format: Annotated[
            LogFormat,
            typer.Option(
                "--log-format",
                help="the services' logs: pretty (for a person), json (as logged), or auto "
                "(pretty on a terminal, json into a file or a pipe)",
            ),
        ] = "auto",
    ) -> None:
        """Run the fleet locally: NATS (embedded unless reachable), topology, every service."""
        url = nats_url or Settings().nats_url
        host, port = host_port(url)
        external = any_reachable(url)
        if nats_cluster > 1:
            if external:
                taken = f"--nats-cluster needs its own servers: {url} is taken"
                status("nats", "red", "✗", f"{taken} (pick free ports: --nats nats://{host}:4230)")
                raise typer.Exit(1)
            # Every process (the launcher's provisioning included) reads it from here.
            os.environ.setdefault("SY_REPLICAS", str(min(3, nats_cluster)))
            url = ",".join(f"nats://{host}:{p}" for p in range(port, port + nats_cluster))
        try:
            agent_roles = role_split(roles) if roles is not None else ()
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--roles") from exc
        procs, skipped = plan(FLEET, workers=workers, engine=engine, edge_port=edge_port,
                              agent_roles=agent_roles)  # fmt: skip
        try:
            procs = with_metrics_ports(procs, metrics_ports)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--metrics-ports") from exc
        topology = build_topology(TopologySettings(nats_url=url))
        nats_dir = data_dir / "nats"
        secrets: LocalSecrets | None = None
        if secure_users:
            if external:
                status("nats", "red", "✗", f"--secure needs its own nats-server: {url} is taken")
                raise typer.Exit(1)
            identities = auth_users() | {p.nats_user for p in procs}
            secrets = LocalSecrets.make(nats_dir, identities, host)
            procs = secure(procs, secrets)

        if external:
            status("nats", "green", "●", f"{url} is reachable: using it")
        elif host in LOCAL_HOSTS:
            verb = "would start" if dry_run else "starting"
            users = f", TLS and the users of {NATS_AUTH}" if secrets is not None else ""
            what = f"an embedded nats-server on {host}:{port}, store {nats_dir}/{users}"
            if nats_cluster > 1:
                replicas = os.environ["SY_REPLICAS"]
                what = (
                    f"a JetStream cluster of {nats_cluster} embedded nats-servers on {url}, "
                    f"stores {nats_dir}/n*, R{replicas} streams{users}"
                )
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

        servers: list[EmbeddedNats] = []
        code = 0
        # SIGTERM and SIGHUP unwind as Ctrl-C does (`sy`'s main: `children.stop_on_signals`).
        try:
            if not external:
                servers = start_nats(host, port, nats_dir, secrets, nats_cluster)
                logs = ", ".join(str(s.data_dir / "nats.log") for s in servers)
                status("nats", "green", "●", f"embedded nats-server on {url}, log {logs}")
            if metrics_ports:
                scrape = write_prometheus_config(
                    data_dir / "prometheus", procs, repo=Path.cwd(),
                    edge_ca=secrets.ca.cert if secrets is not None else None,
                )  # fmt: skip
                status("metrics", "green", "●", f"scrape with: prometheus --config.file {scrape}")
            if secrets is not None:
                admin = nats_dir / "admin.env"
                write_admin_env(admin, url, secrets)
                said = f"TLS, per-service users; operator settings in {admin}"
                status("nats", "green", "●", said)
            code = asyncio.run(supervise(procs, url, servers, secrets, log_format))
        except KeyboardInterrupt:
            code = 130
        except (OSError, RuntimeError, SwitchyardError) as exc:  # no traceback for the expected
            status("up", "red", "✗", f"{type(exc).__name__}: {exc}")
            code = 1
        finally:
            for server in servers:
                server.stop()
            if servers:
                status("nats", "dim", "■", "embedded nats-server stopped")
        raise typer.Exit(code)
