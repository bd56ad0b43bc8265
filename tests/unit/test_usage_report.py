"""`sy usage`'s queries and report (libs/switchyard/cli/usage_commands.py).

tests/integration/test_usage.py runs it against a real Prometheus; here, the PromQL it
sends, its errors, and its report over a canned Prometheus answer (a local HTTP server
answering the query API as Prometheus does), for machines without Prometheus.
"""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest
from typer.testing import CliRunner

from switchyard.cli.app import app
from switchyard.cli.usage_commands import COUNTERS, query, usage_query
from switchyard.errors import SwitchyardError
from switchyard.ports import free_port

pytestmark = pytest.mark.unit


def test_each_column_sums_its_counter_by_tenant_and_pool_over_the_range() -> None:
    q = usage_query("gpu_decode_seconds", 3600.0)
    assert q == (
        'sum by (tenant, pool) ((increase(sy_worker_gpu_seconds_total{phase="decode"}[3600000ms])'
        ' and sy_worker_gpu_seconds_total{phase="decode"} offset 3600000ms)'
        ' or sy_worker_gpu_seconds_total{phase="decode"})'
    )
    for column, (metric, _) in COUNTERS.items():
        tree = promql_parser.parse(usage_query(column, 90.5))
        assert isinstance(tree, promql_parser.AggregateExpr)
        assert metric in str(tree) and "90500ms" in usage_query(column, 90.5)


class Canned(http.server.BaseHTTPRequestHandler):
    """Answers /api/v1/query with one sample per tenant, its value by the query's metric."""

    queries: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        params = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        Canned.queries.append(params)
        query = params["query"][0]
        if "bad" in query:
            self._send(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
            return
        value = {"requests": "12", "prompt": "3400", "completion": "512"}
        v = next((x for k, x in value.items() if k in query), None)
        if v is None:
            v = "1.25" if "prefill" in query else "7.5"
        result = [{"metric": {"tenant": t, "pool": "agent"}, "value": [1.0, v]}
                  for t in ("acme", "other")]  # fmt: skip
        self._send(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_report_as_json_and_as_a_table(canned: str) -> None:
    runner = CliRunner()
    args = ["usage", "--prometheus", canned, "--since", "2026-01-01T00:00:00",
            "--until", "2026-01-02T00:00:00"]  # fmt: skip
    done = runner.invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["since"] == "2026-01-01T00:00:00+00:00"
    assert report["usage"][0] == {
        "tenant": "acme", "pool": "agent", "requests": 12.0, "prompt_tokens": 3400.0,
        "completion_tokens": 512.0, "gpu_prefill_seconds": 1.25, "gpu_decode_seconds": 7.5,
    }  # fmt: skip
    assert [r["tenant"] for r in report["usage"]] == ["acme", "other"]
    sent = Canned.queries[-1]
    assert sent["time"] == ["1767312000.000"] and "[86400000ms]" in sent["query"][0]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "acme" in table.stdout and "3,400" in table.stdout and "7.500" in table.stdout


def test_unreachable_prometheus_a_backwards_range_and_a_bad_time_are_clear_errors() -> None:
    runner = CliRunner()
    gone = runner.invoke(app, ["usage", "--prometheus", f"http://127.0.0.1:{free_port()}"])
    assert gone.exit_code == 1 and "no_capacity" in gone.output
    assert "cannot query Prometheus" in gone.output
    backwards = runner.invoke(app, ["usage", "--since", "0s", "--until", "1h"])
    assert backwards.exit_code == 1 and "invalid_request" in backwards.output
    bad = runner.invoke(app, ["usage", "--since", "yesterday"])
    assert bad.exit_code == 2 and "--since" in bad.output


def test_a_query_prometheus_refuses_is_a_typed_error_with_its_reason(canned: str) -> None:
    with pytest.raises(SwitchyardError, match="parse error") as refused:
        query(canned, "sum(bad", 0.0)
    assert refused.value.code == "invalid_request"
