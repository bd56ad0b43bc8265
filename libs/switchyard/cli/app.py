"""`sy`: run, provision, poke and inspect a Switchyard fleet."""

from __future__ import annotations

import typer

from switchyard.cli import bench_commands, bus_commands, up

app = typer.Typer(
    name="sy",
    help="Switchyard: a NATS JetStream fleet serving LLM and VLM workloads.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bus_commands.register(app)
up.register(app)
bench_commands.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
