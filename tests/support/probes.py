"""Asking a service's probes (`switchyard.probes`) over HTTP, off the event loop."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """GET `/<path>` on 127.0.0.1:`port`: the status and JSON body (0: nothing listens)."""

    def get() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError as e:  # not listening (yet)
            return 0, {"error": str(e)}

    return await asyncio.to_thread(get)
