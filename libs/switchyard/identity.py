"""NATS service identities: one nkey (an Ed25519 key pair) per service.

The service holds its *seed* (the private key, `SU...`) in a file it alone can read
(`SY_NATS_NKEY_SEED_FILE`: a Docker or Kubernetes secret) and proves it by signing the
server's nonce when it connects (nats-py does it, given the file). nats-server holds
only the *public* key (`U...`), in compose/nats-auth.conf's `nkey: $SY_NATS_NKEY_<USER>`:
nothing in the server's configuration is a secret, so a leaked config or environment
opens no connection. deploy/security.md explains why nkeys and not JWT accounts.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import nkeys  # type: ignore[import-untyped]  # no type information shipped


def new_seed() -> bytes:
    """A fresh user nkey seed (`SU...`) from 32 random bytes."""
    seed: bytes = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed


def public_key(seed: bytes) -> str:
    """The public user key (`U...`) nats-server is configured with for `seed`."""
    pair = nkeys.from_seed(bytearray(seed))
    try:
        key: bytes = pair.public_key
        return key.decode()
    finally:
        pair.wipe()


@dataclass(frozen=True)
class Identity:
    """A service's NATS identity: its name in nats-auth.conf, its seed file, its public key."""

    name: str
    seed_file: Path
    public_key: str

    @classmethod
    def ensure(cls, directory: Path, name: str) -> Identity:
        """`<directory>/<name>.nk`, made (mode 0600) if missing and reused otherwise."""
        path = directory / f"{name}.nk"
        if not path.is_file():
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(new_seed())
        return cls(name, path, public_key(path.read_bytes().strip()))

    def server_env(self) -> dict[str, str]:
        """What nats-auth.conf's `$SY_NATS_NKEY_<USER>` resolves to (public: not a secret)."""
        return {f"SY_NATS_NKEY_{self.name.upper()}": self.public_key}
