"""The two questions a launcher asks of this machine's TCP ports.

Core, not `switchyard.fleet`: the embedded nats-server (`switchyard.natsserver`) needs
both, and the core library imports no tool package.
"""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; another process may take it
    before ours binds, which on one machine running one launcher does not happen)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(host: str, port: int, timeout: float = 0.3) -> bool:
    """Whether something accepts TCP connections at `host:port`."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout):
        return True
    return False
