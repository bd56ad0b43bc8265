"""`sy`: run, provision, poke and inspect a Switchyard fleet."""

from __future__ import annotations

import typer

from switchyard.cli import (
    agent_commands,
    audit_commands,
    bench_commands,
    bus_commands,
    edge_commands,
    forensics_commands,
    metrics_commands,
    plan_commands,
    simserver_commands,
    sql_commands,
    up,
)

app = typer.Typer(
    name="sy",
    help="Switchyard: a NATS JetStream fleet serving LLM and VLM workloads.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bus_commands.register(app)
up.register(app)
bench_commands.register(app)
agent_commands.register(app)
sql_commands.register(app)
audit_commands.register(app)
forensics_commands.register(app)
plan_commands.register(app)
edge_commands.register(app)
simserver_commands.register(app)
metrics_commands.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
