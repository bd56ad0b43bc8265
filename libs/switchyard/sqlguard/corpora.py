"""The third-party SQL corpora in `shared/corpora/` (see its README): gold queries that
must be accepted, and LLM predictions that must never crash the validator."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

PREDICTION_SEPARATOR = "\t----- bird -----\t"


@dataclass(frozen=True)
class Statement:
    corpus: str  # "bird_gold", "defog_gold" or "llm:<model file>"
    key: str
    sql: str


def default_dir() -> Path:
    """`SY_SQL_CORPORA`, else `../shared/corpora` from the working directory or the repo."""
    env = os.environ.get("SY_SQL_CORPORA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    for candidate in (Path.cwd().parent / "shared" / "corpora", repo.parent / "shared" / "corpora"):
        if candidate.is_dir():
            return candidate
    return repo.parent / "shared" / "corpora"


def gold(directory: Path) -> list[Statement]:
    out: list[Statement] = []
    bird = json.loads((directory / "bird_minidev_mysql_gold.json").read_text())
    for item in bird:
        out.append(Statement("bird_gold", str(item["question_id"]), item["SQL"]))
    with (directory / "defog_sql_eval_questions_mysql.csv").open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            # One or more acceptable gold queries per question, joined by ';'.
            for j, part in enumerate(row["query"].split(";")):
                if part.strip():
                    out.append(Statement("defog_gold", f"{i}.{j}", part))
    return out


def predictions(directory: Path) -> list[Statement]:
    out: list[Statement] = []
    for path in sorted((directory / "llm_predictions").glob("*.json")):
        for key, value in json.loads(path.read_text()).items():
            sql = value.split(PREDICTION_SEPARATOR)[0]
            out.append(Statement(f"llm:{path.stem}", key, sql))
    return out
