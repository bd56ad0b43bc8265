"""Bearer API keys, stored only as SHA-256 hashes, mapped to a tenant and its grants.

The key file is YAML: `keys: {<sha256 hex>: {tenant: acme, models: [...], pools: [...]}}`
(plus `operator: true` for a key that may watch every tenant).
`models`/`pools` absent means every model/pool the edge serves. The tenant comes
from here and nowhere else: a body never chooses its tenant.

Rotation and revocation need no restart: the file is read again when it changes (its
inode, size or mtime; checked at most every `reload_interval` seconds, on a request).
A tenant may have any number of keys, so a new key is added next to the old one, and
the old one removed once its clients have moved; a removed key is refused from the
next check on. A file that no longer parses (or is gone) keeps the keys last loaded,
with an error in the log: a bad edit must not lock every client out.
"""

from __future__ import annotations

import hmac
import os
import time
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.edge.errors import ApiError
from switchyard.apikeys import PUBLISHED_HASHES, hash_key
from switchyard.envelope import TenantId
from switchyard.logging import get_logger

log = get_logger(__name__)

# What identifies one version of the key file: (inode, size, mtime in ns). An atomic
# replace (write a temporary file, rename it over) changes the inode.
Stamp = tuple[int, int, int]


class Principal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: TenantId
    models: list[str] | None = None
    pools: list[str] | None = None
    # An operator's key also sees every tenant's usage on the console's fleet page;
    # it still asks questions as its own tenant only.
    operator: bool = False

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_use_pool(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: dict[str, Principal] = Field(default_factory=dict)


def _stamp(path: Path) -> Stamp:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class PublishedKeyError(ValueError):
    """The key file holds a key published in this repository, outside local development."""


def _read(path: Path, published: bool) -> dict[str, Principal]:
    """The file's keys, their hashes in lower case (as `hash_key` writes them); raises
    `PublishedKeyError` if it holds a published key and `published` keys are not allowed."""
    keys = KeyFile.model_validate(yaml.safe_load(path.read_text()) or {}).keys
    lowered = {h.lower(): p for h, p in keys.items()}
    if not published and (found := PUBLISHED_HASHES.intersection(lowered)):
        tenants = sorted(lowered[h].tenant for h in found)
        raise PublishedKeyError(
            f"{path} holds API keys published in the Switchyard repository (the local "
            f"development keys of tenants {tenants}): anyone could use them; they are "
            "allowed only with SY_ENV=local"
        )
    return lowered


class KeyRing:
    def __init__(
        self, keys: dict[str, Principal], path: Path | None = None,
        reload_interval: float = 2.0, stamp: Stamp | None = None, published: bool = True,
    ) -> None:  # fmt: skip
        self._keys = keys  # hash (lower case) -> principal
        self._path = path
        self._interval = reload_interval
        self._published = published  # whether the repository's published keys may serve
        self._stamp = stamp
        self._checked = time.monotonic()

    @classmethod
    def load(
        cls, path: Path | None, reload_interval: float = 2.0, *, published: bool = True
    ) -> KeyRing:
        """The keys of `path` (none without one); raises on a bad file, at start-up."""
        if path is None:
            return cls({})
        stamp = _stamp(path)  # before reading: an edit made meanwhile is seen at the next look
        return cls(_read(path, published), path, reload_interval, stamp, published)

    def refresh(self) -> None:
        """Read the file again if it changed and `reload_interval` has passed since the
        last look (a stat per interval, not per request)."""
        now = time.monotonic()
        if self._path is None or now - self._checked < self._interval:
            return
        self._checked = now
        try:
            stamp = _stamp(self._path)
            if stamp == self._stamp:
                return
            self._stamp = stamp  # a bad version is reported once, not on every check
            keys = _read(self._path, self._published)
        except (OSError, yaml.YAMLError, ValidationError, PublishedKeyError) as exc:
            log.error("edge.keys_reload_failed", path=str(self._path), error=str(exc))
            return
        log.info("edge.keys_reloaded", path=str(self._path), keys=len(keys))
        self._keys = keys

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise ApiError(
                401, "missing Bearer API key", "invalid_request_error", "invalid_api_key"
            )
        self.refresh()
        digest = hash_key(authorization[7:].strip())
        # Constant-time compare against every entry: no timing hint about near misses.
        found = None
        for known, principal in self._keys.items():
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise ApiError(401, "invalid API key", "invalid_request_error", "invalid_api_key")
        return found
