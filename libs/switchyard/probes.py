"""Health probes a service's orchestrator polls, served beside `/metrics` on its port:

- `/startupz`: it has started (a worker: its engine loaded and answered a warm-up);
- `/readyz`: it should be given work now (connected to NATS, not stopping);
- `/healthz`: it is alive; failing means "restart me" (a worker: its engine is stuck).

Each answers 200 or 503 with a JSON body naming every check and, for one that fails,
why: `{"ok": false, "checks": {"bus": "ok", "stopping": "stopping: draining"}}`. The
names follow the edge's `/healthz` and `/readyz`.

Checks run on the HTTP server's thread, not the event loop, so a probe answers while
the loop is busy (a loop that is stuck shows as no progress, with its reason, rather
than as a probe's timeout): they only read state.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

Probe = Literal["startupz", "readyz", "healthz"]
PROBES: tuple[Probe, ...] = ("startupz", "readyz", "healthz")

# A check returns None when it passes, else why it fails.
Check = Callable[[], str | None]


class Probes:
    """Named checks for each probe; a probe passes when all of its checks do."""

    def __init__(self) -> None:
        self.checks: dict[Probe, dict[str, Check]] = {probe: {} for probe in PROBES}

    def add(self, probe: Probe, name: str, check: Check) -> None:
        if name in self.checks[probe]:
            raise ValueError(f"{probe} already has a check named {name!r}")
        self.checks[probe][name] = check

    def pending(self, name: str, why: str) -> threading.Event:
        """A check of startup and readiness that fails with `why` until the returned event
        is set. Added before the service starts, it closes the gap between connecting
        and a `main` adding checks of its own."""
        done = threading.Event()
        for probe in ("startupz", "readyz"):
            self.add(probe, name, lambda: None if done.is_set() else why)
        return done

    def answer(self, probe: Probe) -> tuple[bool, dict[str, Any]]:
        """Whether `probe` passes, and the body that says why (or why not)."""
        verdicts = {name: _run(check) for name, check in list(self.checks[probe].items())}
        ok = all(why is None for why in verdicts.values())
        checks = {name: why or "ok" for name, why in verdicts.items()}
        return ok, {"ok": ok, "checks": checks}

    def wsgi(self, other: WSGIApplication) -> WSGIApplication:
        """A WSGI app answering the probes' paths, and every other path with `other`."""

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            path = str(environ.get("PATH_INFO", "")).strip("/")
            if path not in PROBES:
                return other(environ, start_response)
            ok, body = self.answer(path)
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]

        return app


def _run(check: Check) -> str | None:
    try:
        return check()
    except Exception as exc:  # a broken check fails its probe, saying so
        return f"the check failed: {type(exc).__name__}: {exc}"
