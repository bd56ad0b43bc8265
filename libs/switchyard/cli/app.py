"""`sy`: run, provision, poke and inspect a Switchyard fleet."""

from __future__ import annotations

import typer

from switchyard import children
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
    status_commands,
    up,
    usage_commands,
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
status_commands.register(app)
usage_commands.register(app)


def main() -> None:
    # Before any command starts anything: SIGTERM and SIGHUP stop `sy` as Ctrl-C does,
    # and a second signal kills what it started at once (`switchyard.children`).
    children.stop_on_signals()
    app()


if __name__ == "__main__":
    main()
