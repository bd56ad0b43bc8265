"""A throwaway PKI for one test module: a CA, a server certificate for this machine
(SAN 127.0.0.1 and localhost) and a client certificate, as PEM files, made by the same
`switchyard.pki.LocalCA` that `sy up --secure` uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from switchyard.pki import LocalCA


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate clients trust
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path, name: str = "switchyard-test") -> Pki:
    """A fresh CA and its two leaf certificates under `directory`."""
    ca = LocalCA.ensure(directory, f"{name} CA")
    server = ca.issue("localhost", server=True, stem="server")
    client = ca.issue(name, client=True, stem="client")
    return Pki(ca.cert, server.cert, server.key, client.cert, client.key)
