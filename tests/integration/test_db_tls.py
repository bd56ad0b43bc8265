"""Database TLS against a real MariaDB that requires it (issue #25, part 3).

A throwaway server (`tests.support.tlsdb`) with a CA this module makes: the executor
refuses to start without the CA (a typed error, exit status 78 as a process) and serves
with it; the auditor likewise; a CA that did not sign the server's certificate is refused;
accounts made with REQUIRE SSL (`sy sql provision --require-ssl`) cannot log in in
plaintext even when the server lets plaintext in.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from services.auditor.settings import AuditorSettings
from services.auditor.store import AuditWriter, to_row
from services.executor.service import run_executor
from services.executor.settings import ExecutorSettings
from switchyard import subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus
from switchyard.fleet import env_of
from switchyard.messages.sql import AuditEvent, ExecuteReply
from switchyard.sqldb.connection import Account, open_connection
from switchyard.sqldb.executor import SqlExecutor
from switchyard.sqldb.tls import DB_TLS_EXIT, DbTlsError, check_login, pymysql_tls
from tests.conftest import REPO
from tests.support.certs import make_pki
from tests.support.sqlenv import SqlEnv, build, teardown
from tests.support.sqlservices import sql_services
from tests.support.tlsdb import TlsDb, tls_mariadb


@pytest.fixture(scope="module")
def tlsdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsDb]:
    work = tmp_path_factory.mktemp("tlsdb")
    with tls_mariadb(work, make_pki(work / "pki")) as db:
        yield db


@pytest.fixture(scope="module")
def env(tlsdb: TlsDb, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlEnv]:
    """Demo data and the walls of acme and nova, every account REQUIRE SSL."""
    sqlenv = build(
        tlsdb.dsn, tmp_path_factory.mktemp("tls-policies"), ssl_ca=tlsdb.pki.ca, require_ssl=True
    )
    try:
        yield sqlenv
    finally:
        teardown(sqlenv)


@pytest.fixture
def plaintext_allowed(tlsdb: TlsDb) -> Iterator[None]:
    """The server lets plaintext logins in for one test: only the accounts' REQUIRE SSL
    is left to refuse them."""
    tlsdb.require_secure_transport(False)
    try:
        yield
    finally:
        tlsdb.require_secure_transport(True)


def executor_env(env: SqlEnv, nats_url: str, **extra: object) -> dict[str, str]:
    s = env.settings(ExecutorSettings, nats_url=nats_url)
    values = env_of(
        nats_url=nats_url, mysql_host=s.mysql_host, mysql_port=s.mysql_port,
        sql_db_secret=env.db_secret, sql_signing_key=env.signing_key,
        sql_policy_dir=env.policy_dir, sql_demo_prefix=env.prefix,
        sql_schema_prefix=s.sql_schema_prefix, sql_account_prefix=s.sql_account_prefix,
        **extra,
    )  # fmt: skip
    return {**os.environ, **values}


def test_the_executor_process_refuses_to_start_without_the_ca(env: SqlEnv, nats_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.executor"], cwd=REPO, env=executor_env(env, nats_url),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == DB_TLS_EXIT, out
    assert "requires TLS" in out and "SY_MYSQL_SSL_CA" in out, out
    assert "Traceback" not in out, out


async def test_the_executor_serves_over_tls_with_the_ca(
    env: SqlEnv, nats_url: str, bus: Bus, audit_stream: None
) -> None:
    async with sql_services(nats_url, env):  # env.settings carries SY_MYSQL_SSL_CA
        req = env.signed("acme", "select count(*) as n from players")
        reply = await rpc.request(bus.nc, subjects.SQL_EXECUTE, req, ExecuteReply, timeout=15)
        assert reply.ok, reply.error
        assert reply.rows and reply.rows[0][0] > 0


async def test_run_executor_raises_the_typed_error_without_the_ca(
    env: SqlEnv, nats_url: str, bus: Bus
) -> None:
    settings = env.settings(ExecutorSettings, nats_url=nats_url, mysql_ssl_ca=None)
    with pytest.raises(DbTlsError, match="requires TLS"):
        await asyncio.wait_for(run_executor(bus, asyncio.Event(), settings), 30)


async def test_a_ca_that_did_not_sign_the_server_is_refused(env: SqlEnv, tmp_path: Path) -> None:
    stranger = make_pki(tmp_path / "other", name="stranger")
    executor = SqlExecutor(env.settings(mysql_ssl_ca=stranger.ca))
    with pytest.raises(DbTlsError, match="CERTIFICATE_VERIFY_FAILED"):
        await executor.check_login()


def test_the_auditor_writes_over_tls_and_refuses_without_the_ca(env: SqlEnv) -> None:
    s = env.settings()
    common = {
        "mysql_host": s.mysql_host, "mysql_port": s.mysql_port, "sql_db_secret": env.db_secret,
        "sql_account_prefix": env.prefix, "sql_audit_db": env.audit_db,
    }  # fmt: skip
    with pytest.raises(DbTlsError, match="requires TLS"):
        AuditWriter(AuditorSettings(**common)).check_login()
    writer = AuditWriter(AuditorSettings(**common, mysql_ssl_ca=env.ssl_ca))
    try:
        assert writer.check_login()
        event = AuditEvent(tenant="acme", request_id="tls-1", event="execute", actor="executor")
        assert writer.write([to_row(event, "sql")]) == 1
    finally:
        writer.close()


def tenant_login(env: SqlEnv, tenant: str, *, tls: bool) -> None:
    user = env.naming.tenant_user(tenant)
    s = env.settings()
    pymysql.connect(
        host=s.mysql_host, port=s.mysql_port, user=user, password=env.naming.password(user),
        connect_timeout=5, **pymysql_tls(env.tls if tls else None),
    ).close()  # fmt: skip


def sy_provision(env: SqlEnv, tenant: str, *flags: str) -> None:
    s = env.settings()
    proc = subprocess.run(
        [sys.executable, "-m", "switchyard.cli.app", "sql", "provision", "--tenant", tenant,
         "--no-auditor", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env_of(
            mysql_dsn=env.dsn, mysql_ssl_ca=env.ssl_ca, sql_db_secret=env.db_secret,
            sql_demo_prefix=env.prefix, sql_schema_prefix=s.sql_schema_prefix,
            sql_account_prefix=s.sql_account_prefix, sql_policy_dir=env.policy_dir,
        )},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_a_server_without_tls_is_refused_to_a_client_with_a_ca(
    mysql_params: dict[str, Any], mysql_conn: Any, tlsdb: TlsDb
) -> None:
    """The shared MariaDB has TLS off: a client holding a CA does not go on in plaintext
    (aiomysql would, unchecked)."""
    with mysql_conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES LIKE 'have_ssl'")
        row = cur.fetchone()
    if row and row[1] == "YES":
        pytest.skip("the shared MariaDB has TLS on: no server without TLS to test against")
    p = mysql_params
    ctx = tlsdb.tls()
    with pytest.raises(DbTlsError, match="SSL is required"):
        check_login(p["host"], p["port"], p["user"], p["password"], ctx)
    account = Account(p["host"], p["port"], p["user"], p["password"], tls=ctx)
    with pytest.raises(DbTlsError, match="offers no TLS"):
        await open_connection(account, statement_seconds=5)


@pytest.mark.usefixtures("plaintext_allowed")
def test_a_require_ssl_account_cannot_log_in_in_plaintext(env: SqlEnv) -> None:
    sy_provision(env, "zen", "--require-ssl")
    with pytest.raises(pymysql.err.OperationalError) as refused:
        tenant_login(env, "zen", tls=False)
    assert refused.value.args[0] == 1045  # access denied: the password alone is not enough
    tenant_login(env, "zen", tls=True)

    # Provisioning again without it lifts the requirement (the walls follow the settings),
    # of the shared planner account too: put it back for the other tests.
    sy_provision(env, "zen", "--no-require-ssl")
    try:
        tenant_login(env, "zen", tls=False)
    finally:
        sy_provision(env, "zen", "--require-ssl")


@pytest.mark.usefixtures("plaintext_allowed")
async def test_the_executor_without_the_ca_refuses_require_ssl_accounts(env: SqlEnv) -> None:
    """The server lets plaintext in, the executor's accounts do not: still a typed error."""
    with pytest.raises(DbTlsError, match="requires TLS"):
        await SqlExecutor(env.settings(mysql_ssl_ca=None)).check_login()
