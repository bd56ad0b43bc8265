"""API keys are stored only as their SHA-256 hash: the edge's key file, `sy edge hash-key`,
and the fleets that benches and tests start all hash a key here, the one way."""

from __future__ import annotations

import hashlib


def hash_key(key: str) -> str:
    """The lowercase hex SHA-256 of `key`, as the edge's key file stores it."""
    return hashlib.sha256(key.encode()).hexdigest()


# Keys written in this repository (deploy/local/edge-keys.yaml, the README, `sy up`):
# anyone can read them, so an edge serves them only with SY_ENV=local.
PUBLISHED_KEYS = ("sk-local-dev", "sk-local-acme", "sk-local-ops")
PUBLISHED_HASHES = frozenset(hash_key(key) for key in PUBLISHED_KEYS)
