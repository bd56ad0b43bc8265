"""The MySQL fixtures reach a real MariaDB (or MySQL) server, not a stand-in."""

from __future__ import annotations

import re
from typing import Any


def test_server_reports_a_real_version(mysql_conn: Any) -> None:
    with mysql_conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        (version,) = cur.fetchone()
    assert "MariaDB" in version or re.match(r"^\d+\.\d+\.\d+", version), version


def test_round_trip_through_a_scratch_database(mysql_conn: Any, unique: str) -> None:
    db = f"sy_test_{unique}"
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        try:
            cur.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, name VARCHAR(32))")
            cur.execute(f"INSERT INTO `{db}`.t VALUES (%s, %s), (%s, %s)", (1, "a", 2, "b"))
            cur.execute(f"SELECT id, name FROM `{db}`.t ORDER BY id")
            assert cur.fetchall() == ((1, "a"), (2, "b"))
        finally:
            cur.execute(f"DROP DATABASE `{db}`")
