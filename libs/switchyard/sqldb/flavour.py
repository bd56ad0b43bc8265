"""MariaDB or MySQL: the few statements that differ, chosen from `SELECT VERSION()`.

- statement time limit: MariaDB `max_statement_time` in seconds (and per user,
  `MAX_STATEMENT_TIME`); MySQL `max_execution_time` in milliseconds, SELECT only,
  and no per-user limit;
- rows examined: MariaDB's `Rows_read` status; MySQL's handler read counters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")
# Session status counters whose growth is the rows a statement read.
_MARIADB_READS = ("Rows_read",)
_MYSQL_READS = (
    "Handler_read_first", "Handler_read_key", "Handler_read_last", "Handler_read_next",
    "Handler_read_prev", "Handler_read_rnd", "Handler_read_rnd_next",
)  # fmt: skip


@dataclass(frozen=True)
class Flavour:
    name: Literal["mariadb", "mysql"]
    version: tuple[int, int, int]

    @classmethod
    def from_version(cls, version: str) -> Flavour:
        m = _VERSION.match(version)
        numbers = (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else (0, 0, 0)
        return cls("mariadb" if "mariadb" in version.lower() else "mysql", numbers)

    @property
    def is_mariadb(self) -> bool:
        return self.name == "mariadb"

    def timed(self, sql: str, seconds: float) -> str:
        """`sql` under a server-side time limit (MariaDB); MySQL uses `session_timeout`."""
        if self.is_mariadb:
            return f"SET STATEMENT max_statement_time={seconds:.3f} FOR {sql}"
        return sql

    def session_timeout(self, seconds: float) -> str:
        if self.is_mariadb:
            return f"SET SESSION max_statement_time = {seconds:.3f}"
        return f"SET SESSION max_execution_time = {max(1, int(seconds * 1000))}"

    def user_limits(self, max_connections: int, statement_seconds: float) -> str:
        """The resource clause of CREATE/ALTER USER."""
        clause = f"WITH MAX_USER_CONNECTIONS {int(max_connections)}"
        if self.is_mariadb:
            clause += f" MAX_STATEMENT_TIME {statement_seconds:.3f}"
        return clause

    @property
    def read_counters(self) -> tuple[str, ...]:
        return _MARIADB_READS if self.is_mariadb else _MYSQL_READS

    def read_counters_sql(self) -> str:
        names = ", ".join(f"'{n}'" for n in self.read_counters)
        return f"SHOW SESSION STATUS WHERE Variable_name IN ({names})"

    # Server errors that mean "stopped by a time limit or KILL QUERY".
    @property
    def interrupted_errors(self) -> frozenset[int]:
        # 1317 query interrupted (KILL QUERY), 1969 max_statement_time (MariaDB),
        # 3024 max_execution_time (MySQL), 1028 sort aborted by a kill.
        return frozenset({1317, 1969, 3024, 1028})
