"""`sy trace` and `sy replay`: explain a request after the fact, from the streams."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from switchyard.bus.connection import Bus
from switchyard.bus.provision import provision
from switchyard.bus.streamread import Window
from switchyard.bus.topology import build_topology
from switchyard.cli import console, err
from switchyard.cli.audit_commands import parse_since
from switchyard.cli.bus_commands import NatsUrl, _settings, cli_connect, run_or_exit
from switchyard.forensics import replay as rp
from switchyard.forensics.compare import DiffReport, compare
from switchyard.forensics.trace import Trace, find


def _epoch(text: str | None) -> float | None:
    if text is None:
        return None
    return parse_since(text).replace(tzinfo=dt.UTC).timestamp()


def print_trace(trace: Trace) -> None:
    table = Table(title=f"request {trace.request_id}  trace {trace.trace_id or '-'}")
    for col, justify in (("hop", "left"), ("t (ms)", "right"), ("+ms", "right"),
                         ("where", "left"), ("detail", "left")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    steps = trace.steps()
    origin = steps[0][0].at if steps else 0.0
    for hop, delta in steps:
        table.add_row(hop.name, f"{(hop.at - origin) * 1000:.1f}", f"{delta * 1000:.1f}",
                      hop.where, hop.detail)  # fmt: skip
    console.print(table)
    console.print(
        f"tenant {trace.tenant}  kind {trace.kind}  status {trace.status}  "
        f"end to end {trace.end_to_end * 1000:.1f} ms (the sum of the +ms column)"
    )
    if trace.stages:
        stages = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in trace.stages.items())
        console.print(f"sqlflow stages: {stages}")


def print_report(report: DiffReport) -> None:
    colour = "green" if report.identical else "red"
    console.print(f"[{colour}]{report.verdict()}[/{colour}]")
    timing = report.timing()

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    console.print(
        f"end to end p50 {ms(timing['recorded_p50'])} recorded vs {ms(timing['replayed_p50'])} "
        f"replayed; p99 {ms(timing['recorded_p99'])} vs {ms(timing['replayed_p99'])}"
    )
    if report.differences:
        table = Table(title="differences (first 50)")
        for col in ("original", "replay", "what", "recorded", "replayed"):
            table.add_column(col, overflow="fold")
        for d in report.differences[:50]:
            table.add_row(d.original_id, d.replay_id, d.what, str(d.recorded)[:200],
                          str(d.replayed)[:200])  # fmt: skip
        console.print(table)


def register(app: typer.Typer) -> None:
    @app.command()
    def trace(
        request_id: Annotated[str, typer.Argument(help="the request id (x-request-id)")],
        window: Annotated[float, typer.Option(help="seconds after the id's time to read")] = 600.0,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
        nats_url: NatsUrl = None,
    ) -> None:
        """Rebuild one request's path from INGRESS, RES, AUDIT and DLQ, hop by hop."""

        async def run() -> Trace:
            async with await cli_connect(_settings(nats_url), "sy-trace") as bus:
                return await find(bus.js, request_id, window=window)

        found = run_or_exit(run())
        if as_json:
            console.print_json(data=found.as_json())
        else:
            print_trace(found)

    @app.command()
    def replay(
        stream: Annotated[str, typer.Option(help="stream to read")] = "INGRESS",
        subject: Annotated[str, typer.Option(help="subject filter, e.g. agent.in.acme")] = ">",
        since: Annotated[str | None, typer.Option(help="start: 15m, 2h or an ISO time")] = None,
        until: Annotated[str | None, typer.Option(help="end: 5m (ago) or an ISO time")] = None,
        first_seq: Annotated[int | None, typer.Option(help="first stream sequence")] = None,
        last_seq: Annotated[int | None, typer.Option(help="last stream sequence")] = None,
        request_id: Annotated[
            list[str] | None, typer.Option("--request-id", help="only these (repeatable)")
        ] = None,
        limit: Annotated[int | None, typer.Option(help="at most this many messages")] = None,
        view: Annotated[bool, typer.Option("--view", help="print the messages, send none")] = False,
        to: Annotated[
            str | None, typer.Option("--to", help="sandbox: NATS URL of another fleet")
        ] = None,
        live: Annotated[bool, typer.Option("--live", help="send onto the live subjects")] = False,
        pace: Annotated[str, typer.Option(help="original (recorded gaps) or fast")] = "fast",
        speed: Annotated[float, typer.Option(help="original pace sped up this much")] = 1.0,
        concurrency: Annotated[int, typer.Option(help="fast pace: requests in flight")] = 1,
        wait: Annotated[float, typer.Option(help="seconds to wait for each result")] = 120.0,
        report: Annotated[Path | None, typer.Option(help="write the diff report JSON here")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
        nats_url: NatsUrl = None,
    ) -> None:
        """Select a window of a stream; --view it, or send it again (--to a sandbox or --live)
        and compare the new results with the recorded ones."""
        if pace not in ("original", "fast"):
            raise typer.BadParameter("--pace is original or fast")
        if not view and (to is None) == (not live):
            raise typer.BadParameter("say where to send: --to NATS_URL (a sandbox) or --live")
        window = Window(subject=subject, since=_epoch(since), until=_epoch(until),
                        first_seq=first_seq, last_seq=last_seq, limit=limit)  # fmt: skip

        async def run() -> int:
            source = await cli_connect(_settings(nats_url), "sy-replay")
            target: Bus | None = None
            try:
                chosen = [x async for x in rp.select(source.js, window, stream=stream,
                                                     request_ids=request_id or ())]  # fmt: skip
                if view:
                    for stored, message in chosen:
                        shown = rp.view(stored, message)
                        if as_json:
                            print(json.dumps(shown, default=str))
                        else:
                            console.print_json(data=shown, default=str)
                    err.print(f"{len(chosen)} message(s)")
                    return 0
                requests = rp.replayable(chosen)
                if not requests:
                    err.print("nothing to replay: no agent steps, chats or questions selected")
                    return 1
                if to is not None:
                    target = await cli_connect(_settings(to), "sy-replay-sandbox")
                    await provision(target.js, build_topology(_settings(to)))
                dest = target or source
                with Progress(console=err, transient=True) as bar:
                    task = bar.add_task(f"replaying {len(requests)}", total=len(requests))
                    sent, replayed = await rp.send(
                        dest.nc, dest.js, requests, pace=pace,  # type: ignore[arg-type]
                        speed=speed, concurrency=concurrency, result_timeout=wait,
                        progress=lambda: bar.advance(task),
                    )  # fmt: skip
                diff = compare(sent, await rp.recorded(source.js, requests), replayed)
                if report is not None:
                    report.write_text(json.dumps(diff.as_json(), indent=2, default=str))
                if as_json:
                    print(json.dumps(diff.as_json(), default=str))
                else:
                    print_report(diff)
                return 0 if diff.identical else 3
            finally:
                await source.close()
                if target is not None:
                    await target.close()

        raise typer.Exit(run_or_exit(run()))
