"""A throwaway MariaDB with TLS for one test module: its own datadir, socket and port,
the certificates of `tests.support.certs`, and `require_secure_transport` on, so every
plaintext TCP login is refused.

The shared server (127.0.0.1:3306) has TLS off and must stay as it is; this one starts
in about a second (an empty datadir, a small buffer pool, no binlog) and is stopped at
the end. On a fresh machine `deploy/local/ensure-mariadb.sh` installs the binaries.
"""

from __future__ import annotations

import contextlib
import getpass
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql

from switchyard.ports import free_port
from switchyard.sqldb.admin import connect_admin
from tests.support.certs import Pki

MARIADBD = "/usr/sbin/mariadbd"


@dataclass(frozen=True)
class TlsDb:
    port: int
    pki: Pki

    @property
    def dsn(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca))

    def require_secure_transport(self, on: bool) -> None:
        conn = connect_admin(self.dsn, self.tls())
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET GLOBAL require_secure_transport = {'ON' if on else 'OFF'}")
        finally:
            conn.close()


def _binary(name: str, fallback: str) -> str:
    found = shutil.which(name) or (fallback if Path(fallback).exists() else None)
    if found is None:
        raise RuntimeError(f"{name} not found: run deploy/local/ensure-mariadb.sh")
    return found


@contextlib.contextmanager
def tls_mariadb(workdir: Path, pki: Pki, ready_timeout: float = 30.0) -> Iterator[TlsDb]:
    """A MariaDB requiring TLS on a free port of 127.0.0.1; root logs in without a password
    (over TLS)."""
    mariadbd = _binary("mariadbd", MARIADBD)
    datadir, port = workdir / "data", free_port()
    # As whoever runs the tests: mariadbd refuses root unless told --user=root.
    user = getpass.getuser()
    subprocess.run(
        [_binary("mariadb-install-db", "/usr/bin/mariadb-install-db"), "--no-defaults",
         f"--datadir={datadir}", f"--user={user}", "--auth-root-authentication-method=normal",
         "--skip-test-db"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    log = workdir / "mariadbd.log"
    proc = subprocess.Popen(
        [mariadbd, "--no-defaults", f"--datadir={datadir}", f"--socket={workdir / 'sock'}",
         f"--pid-file={workdir / 'pid'}", f"--port={port}", "--bind-address=127.0.0.1",
         f"--user={user}", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
         f"--ssl-ca={pki.ca}", f"--ssl-cert={pki.server_cert}", f"--ssl-key={pki.server_key}",
         "--require-secure-transport", f"--log-error={log}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    db = TlsDb(port, pki)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            try:
                connect_admin(db.dsn, db.tls()).close()
                break
            except pymysql.err.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(f"the TLS MariaDB did not start:\n{tail}") from None
                time.sleep(0.1)
        yield db
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
