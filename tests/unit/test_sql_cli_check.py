"""`sy sql check` as an operator runs it: stdin in, one JSON verdict per line out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from switchyard.sqlguard.corpora import default_dir, gold
from tests.conftest import REPO

POLICY = """dialect: mysql
max_limit: 100
tables:
  t_acme.players: "*"
  t_acme.daily_activity: [day, server_id, dau]
"""


def sy_check(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli.app", "sql", "check", *args],
        input=stdin, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_json_lines_one_verdict_each(policy: Path) -> None:
    lines = [
        {"sql": "SELECT day, dau FROM t_acme.daily_activity LIMIT 5000"},
        {"sql": "SELECT * FROM t_acme.daily_activity"},
        {"sql": "SELECT 1; DROP TABLE t_acme.players"},
        {"nope": 1},
    ]
    stdin = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n\n"
    done = sy_check("--policy", str(policy), stdin=stdin)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(out) == 6
    assert out[0] == {
        "ok": True,
        "sql": "SELECT `day`, `dau` FROM `t_acme`.`daily_activity` LIMIT 100",
    }
    assert out[1]["ok"] is False and out[1]["rule"] == "column.star" and out[1]["detail"]
    assert out[2]["rule"] == "statement.multiple"
    assert [o["rule"] for o in out[3:]] == ["input.malformed", "input.malformed", "input.empty"]
    assert all(set(o) == {"ok", "rule", "detail"} for o in out[1:])


def test_lines_mode_and_any_table(policy: Path) -> None:
    stdin = "SELECT a FROM somewhere.t\nSELECT LOAD_FILE('/etc/passwd')\n"
    done = sy_check("--lines", "--allow-any-table", stdin=stdin)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert out[0]["ok"] is True and out[1]["rule"] == "syntax.function"
    strict = sy_check("--lines", "--policy", str(policy), stdin=stdin)
    assert [json.loads(x)["rule"] for x in strict.stdout.splitlines()] == [
        "table.not_allowed",
        "syntax.function",
    ]


def test_unusable_arguments_exit_non_zero(tmp_path: Path) -> None:
    assert sy_check(stdin="").returncode != 0  # no policy and no --allow-any-table
    bad = tmp_path / "bad.yaml"
    bad.write_text("surprise: 1\n")
    assert sy_check("--policy", str(bad), stdin="SELECT 1\n").returncode != 0
    assert sy_check("--policy", str(tmp_path / "missing.yaml"), stdin="").returncode != 0


@pytest.mark.skipif(
    not (default_dir() / "bird_minidev_mysql_gold.json").is_file(), reason="no corpora"
)
def test_every_gold_query_through_the_cli() -> None:
    statements = gold(default_dir())
    stdin = "".join(json.dumps({"sql": s.sql}) + "\n" for s in statements)
    done = sy_check("--allow-any-table", stdin=stdin)
    assert done.returncode == 0, done.stderr
    verdicts = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(verdicts) == len(statements)
    assert [v for v in verdicts if not v["ok"]] == []
