"""`sy usage`: what each tenant used per pool over a time range, from Prometheus.

The source is the workers' usage counters (`sy_worker_engine_requests_total`,
`..._prompt_tokens_total`, `..._completion_tokens_total`, `sy_worker_gpu_seconds_total`)
as Prometheus keeps them, read with `increase(...[range])` at the range's end: the
fleet's own history, whatever workers came and went, and no second store to keep. The
RES stream is not read: it holds results only for its retention and was never meant to
be scanned for a month's bill. What that costs: Prometheus extrapolates `increase` to
the range's edges (a few scrape intervals' worth of estimate on a range of hours), a
series born and gone (5 min stale) within the range is missed, and tenants beyond a
worker's top 20 are summed as `other` (`switchyard.metrics.TenantLabel`).

GPU-seconds are each request's share of its engine's time: the engine's time split
equally among the requests it held at once, so the shares add up to the GPU's busy
time and a batch is not billed once per request (`services/worker/enginetime.py`).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from switchyard.cli import console, err
from switchyard.cli.audit_commands import parse_since
from switchyard.errors import SwitchyardError

# Report column -> the counter it sums, and the label it splits by beyond tenant and pool.
COUNTERS: dict[str, tuple[str, tuple[str, str] | None]] = {
    "requests": ("sy_worker_engine_requests_total", None),
    "prompt_tokens": ("sy_worker_prompt_tokens_total", None),
    "completion_tokens": ("sy_worker_completion_tokens_total", None),
    "gpu_prefill_seconds": ("sy_worker_gpu_seconds_total", ("phase", "prefill")),
    "gpu_decode_seconds": ("sy_worker_gpu_seconds_total", ("phase", "decode")),
}
QUERY_TIMEOUT = 30.0  # s


@dataclass
class TenantUsage:
    tenant: str
    pool: str
    requests: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    gpu_prefill_seconds: float = 0.0
    gpu_decode_seconds: float = 0.0


def usage_query(column: str, range_seconds: float) -> str:
    """The PromQL of one report column over the `range_seconds` before the query time.

    A series that already existed at the range's start counts its `increase`; one born
    within the range (a tenant's first request on a worker, a worker started since)
    counts its whole value, all of it counted within the range: `increase` alone would
    lose what it held at its first scrape."""
    metric, split = COUNTERS[column]
    x = metric if split is None else f'{metric}{{{split[0]}="{split[1]}"}}'
    window = f"{max(1, round(range_seconds * 1000))}ms"
    return f"sum by (tenant, pool) ((increase({x}[{window}]) and {x} offset {window}) or {x})"


def query(prometheus: str, promql: str, at: float) -> list[dict[str, Any]]:
    """An instant query's vector (Prometheus's HTTP API); a typed error when it fails."""
    url = f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode(
        {"query": promql, "time": f"{at:.3f}"}
    )
    try:
        with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT) as response:  # noqa: S310
            body = json.load(response)
    except urllib.error.HTTPError as exc:  # Prometheus refused the query: says why in JSON
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {"error": f"HTTP {exc.code} {exc.reason}"}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SwitchyardError(f"cannot query Prometheus at {prometheus}: {exc}",
                              code="no_capacity") from exc  # fmt: skip
    if body.get("status") != "success":
        why = body.get("error") or f"answered {body!r}"
        raise SwitchyardError(f"Prometheus refused {promql!r}: {why}", code="invalid_request")
    data = body["data"]
    if data.get("resultType") != "vector":
        raise SwitchyardError(f"not a vector: {data.get('resultType')}", code="invalid_request")
    return list(data["result"])


def usage(prometheus: str, since: float, until: float) -> list[TenantUsage]:
    """Each tenant's usage per pool over [since, until] (Unix seconds), by tenant."""
    if until <= since:
        raise SwitchyardError(f"the range ends ({until}) before it starts ({since})",
                              code="invalid_request")  # fmt: skip
    rows: dict[tuple[str, str], TenantUsage] = {}
    for column in COUNTERS:
        for sample in query(prometheus, usage_query(column, until - since), until):
            labels = sample["metric"]
            key = (labels.get("tenant", ""), labels.get("pool", ""))
            row = rows.setdefault(key, TenantUsage(*key))
            setattr(row, column, float(sample["value"][1]))
    return [rows[k] for k in sorted(rows)]


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


def _unix(text: str, option: str) -> float:
    try:
        return parse_since(text).replace(tzinfo=dt.UTC).timestamp()
    except typer.BadParameter as exc:
        raise typer.BadParameter(f"{option} {text!r}: use 30m, 1h, 2d or an ISO time") from exc


def register(app: typer.Typer) -> None:
    @app.command("usage")
    def usage_command(
        prometheus: Annotated[
            str,
            typer.Option(envvar="SY_PROMETHEUS_URL", help="Prometheus's URL (its HTTP API)"),
        ] = "http://127.0.0.1:9090",
        since: Annotated[
            str, typer.Option(help="the range's start: a time back from now (24h, 7d) or ISO")
        ] = "24h",
        until: Annotated[str, typer.Option(help="the range's end: as --since; 0s = now")] = "0s",
        as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
    ) -> None:
        """Requests, tokens and GPU-seconds (prefill, decode) per tenant and pool.

        A GPU-second is a request's share of its engine's time: the time split equally
        among the requests the engine held at once, so a batch of 4 sharing the GPU for
        2 s costs 0.5 s each and the tenants' shares add up to the GPU's busy time.
        Figures come from Prometheus's increase() over the range (an estimate at its
        edges); tenants beyond a worker's top 20 are summed as `other`.
        """
        start, end = _unix(since, "--since"), _unix(until, "--until")
        try:
            rows = usage(prometheus, start, end)
        except SwitchyardError as exc:
            err.print(f"[red]{exc.code}[/red]: {exc.reason}")
            raise typer.Exit(1) from exc
        if as_json:
            print(json.dumps({"since": _iso(start), "until": _iso(end), "prometheus": prometheus,
                              "usage": [asdict(r) for r in rows]}))  # fmt: skip
            return
        if not rows:
            console.print(f"no usage recorded between {_iso(start)} and {_iso(end)}")
            return
        t = Table(Column("tenant", no_wrap=True), Column("pool", no_wrap=True), "requests",
                  "prompt tokens", "completion tokens", "GPU-s prefill", "GPU-s decode",
                  title=f"{_iso(start)} - {_iso(end)}")  # fmt: skip
        for r in rows:
            t.add_row(
                r.tenant, r.pool, f"{r.requests:,.0f}", f"{r.prompt_tokens:,.0f}",
                f"{r.completion_tokens:,.0f}", f"{r.gpu_prefill_seconds:,.3f}",
                f"{r.gpu_decode_seconds:,.3f}",
            )  # fmt: skip
        console.print(t)
