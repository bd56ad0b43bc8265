"""The edge's HTTPS, its security headers, and API keys rotated and revoked while it runs
(issue #25, part 4). A real edge under uvicorn on the session's NATS, real HTTP(S)
requests with httpx trusting a CA this module makes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.certs import Pki, make_pki
from tests.support.edge import edge_in_process, write_keys
from tests.support.poll import until

CONSOLE_CSP = "default-src 'self'"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("edge-pki"))


@contextlib.asynccontextmanager
async def https_client(pki: Pki) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca)) as client:
        yield client


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_https_with_hsts_and_secure_headers(nats_url: str, pki: Pki, tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml", {"sk-acme": {"tenant": "acme"}})
    async with (
        edge_in_process(
            nats_url, api_keys_file=keys, https_cert=pki.server_cert, https_key=pki.server_key,
            hsts_max_age=600,
        ) as url,
        https_client(pki) as client,
    ):  # fmt: skip
        assert url.startswith("https://")
        page = await client.get(f"{url}/console")
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert page.headers["strict-transport-security"] == "max-age=600"
        assert page.headers["content-security-policy"].startswith(CONSOLE_CSP)
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["referrer-policy"] == "no-referrer"

        script = await client.get(f"{url}/console/static/api.js")
        assert script.status_code == 200
        assert script.headers["x-content-type-options"] == "nosniff"
        assert script.headers["strict-transport-security"] == "max-age=600"

        models = await client.get(f"{url}/v1/models", headers=auth("sk-acme"))
        assert models.status_code == 200, models.text
        assert models.headers["strict-transport-security"] == "max-age=600"
        assert models.headers["x-content-type-options"] == "nosniff"
        refused = await client.get(f"{url}/v1/models", headers=auth("sk-nobody"))
        assert refused.status_code == 401
        assert refused.headers["x-frame-options"] == "DENY"

        # A client that does not trust the CA is refused; plain HTTP is not served.
        async with httpx.AsyncClient() as untrusting:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.get(f"{url}/healthz")
            with pytest.raises(httpx.HTTPError):
                await untrusting.get(url.replace("https://", "http://") + "/healthz")


async def test_plain_http_has_the_headers_but_no_hsts(nats_url: str) -> None:
    async with edge_in_process(nats_url) as url, httpx.AsyncClient() as client:
        page = await client.get(f"{url}/console")
        assert page.status_code == 200
        assert "strict-transport-security" not in page.headers  # browsers ignore it on http
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-frame-options"] == "DENY"


def replace_keys(path: Path, keys: dict[str, dict[str, Any]]) -> None:
    """As an operator should: write a new file and rename it over the old one."""
    write_keys(path.with_suffix(".new"), keys)
    os.replace(path.with_suffix(".new"), path)


async def test_keys_rotate_and_revoke_without_a_restart(
    nats_url: str, pki: Pki, tmp_path: Path
) -> None:
    keys = write_keys(tmp_path / "keys.yaml", {"sk-old": {"tenant": "acme"}})
    async with (
        edge_in_process(
            nats_url, api_keys_file=keys, api_keys_reload_interval=0.1,
            https_cert=pki.server_cert, https_key=pki.server_key,
        ) as url,
        https_client(pki) as client,
    ):  # fmt: skip

        async def status(key: str) -> int:
            return (await client.get(f"{url}/v1/models", headers=auth(key))).status_code

        async def accepted(key: str) -> bool:
            return await status(key) == 200

        async def refused(key: str) -> bool:
            return await status(key) == 401

        assert await accepted("sk-old") and await refused("sk-new")

        # Rotation: the new key is added next to the old one; both work meanwhile.
        replace_keys(keys, {"sk-old": {"tenant": "acme"}, "sk-new": {"tenant": "acme"}})
        await until(lambda: accepted("sk-new"), timeout=10, what="the new key accepted")
        assert await accepted("sk-old")

        # A file that does not parse keeps the keys last loaded (an error in the log).
        keys.write_text("keys: [not, a, mapping")
        await asyncio.sleep(0.3)  # past the reload interval: the next request looks
        assert await accepted("sk-old") and await accepted("sk-new")

        # Revocation: the old key is removed (an in-place edit is seen too).
        write_keys(keys, {"sk-new": {"tenant": "acme"}})
        await until(lambda: refused("sk-old"), timeout=10, what="the old key refused")
        assert await accepted("sk-new")
