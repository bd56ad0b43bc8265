"""An OTLP/HTTP endpoint that takes every export and keeps nothing: what the traced
Switchyard columns of `sy bench peers overhead --trace-sample` export to, so that they
pay tracing's whole cost in the fleet (spans made, encoded, POSTed) with no collector on
the machine. `python -m switchyard.bench.peers.otlpsink PORT`; GET answers 200 (ready)."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the exporter keeps its connection

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._empty()

    def do_GET(self) -> None:
        self._empty()

    def _empty(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per export would be the sink's main cost


def main() -> None:
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), _Sink).serve_forever()


if __name__ == "__main__":
    main()
