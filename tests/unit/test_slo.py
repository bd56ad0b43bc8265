"""Per-pool SLOs (deploy/prometheus/slos.yml): parsing with clear errors, and the alert
and goodput rules generated from them into deploy/prometheus/rules.yml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from switchyard.cli.app import app
from switchyard.slo import (
    ANSWERS,
    GOODPUT,
    SloError,
    Slos,
    load_slos,
    render_rules,
    rules_in_step,
    write_rules,
)
from tests.conftest import REPO

pytestmark = pytest.mark.unit

SLOS = REPO / "deploy" / "prometheus" / "slos.yml"
RULES = REPO / "deploy" / "prometheus" / "rules.yml"


def slo_file(tmp_path: Path, pools: object) -> Path:
    path = tmp_path / "slos.yml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    return path


def test_the_shipped_slos_give_each_workload_its_own() -> None:
    slos = load_slos(SLOS)
    agent, chat, sql = slos.pools["agent"], slos.pools["llm"], slos.pools["sql"]
    # An agent step's first token well within its 500 ms step budget; the step within it.
    assert agent.ttft_p99 <= 0.25 and agent.duration_p99 == 0.5 and agent.goodput == "duration"
    assert chat.ttft_p99 > agent.ttft_p99 and chat.duration_p99 is None
    assert sql.duration_p99 is not None and sql.duration_p99 > agent.duration_p99


def test_the_checked_in_rules_are_those_the_slos_make() -> None:
    assert rules_in_step(RULES, load_slos(SLOS)), "run `sy metrics rules --write`"


@pytest.mark.parametrize(
    ("pools", "says"),
    [
        ({"agent": {"ttft_p99": 0.25}}, "pools.agent: Value error, ttft_p99 0.25 s is not a"),
        ({"agent": {"ttft_p99": 0.2, "goodput": "duration"}}, "goodput by duration needs"),
        ({"agent": {"ttft_p99": 0.5, "duration_p99": 0.2}}, "duration_p99 is shorter"),
        ({"agent": {"ttft_p99": 0.2, "ttft_p50": 0.1}}, "pools.agent.ttft_p50: Extra inputs"),
        ({"agent": {"ttft_p99": "soon"}}, "pools.agent.ttft_p99: Input should be a valid"),
        ({"agent": {"ttft_p99": 0.2, "severity": "loud"}}, "pools.agent.severity"),
        ({"bad pool": {"ttft_p99": 0.2}}, "should match pattern"),
        ({}, "pools: Dictionary should have at least 1 item"),
    ],
)
def test_a_bad_slo_file_is_refused_saying_where(tmp_path: Path, pools: object, says: str) -> None:
    path = slo_file(tmp_path, pools)
    with pytest.raises(SloError, match=r"slos\.yml") as caught:
        load_slos(path)
    assert says in str(caught.value)


def test_an_unreadable_file_is_a_slo_error(tmp_path: Path) -> None:
    with pytest.raises(SloError, match="No such file"):
        load_slos(tmp_path / "none.yml")
    broken = tmp_path / "broken.yml"
    broken.write_text("pools: [unclosed")
    with pytest.raises(SloError, match=r"broken\.yml"):
        load_slos(broken)


def test_each_pool_gets_its_alerts_and_its_goodput_rules() -> None:
    slos = Slos.model_validate({"pools": {
        "chat": {"ttft_p99": 1.0},
        "steps": {"ttft_p99": 0.15, "duration_p99": 0.5, "goodput": "duration",
                  "severity": "ticket"},
    }})  # fmt: skip
    groups = yaml.safe_load("groups:\n" + render_rules(slos))["groups"]
    alerts = {(r["alert"], r["labels"]["pool"]): r for r in groups[0]["rules"]}
    assert set(alerts) == {("SwitchyardTTFTOverSLO", "chat"), ("SwitchyardTTFTOverSLO", "steps"),
                           ("SwitchyardDurationOverSLO", "steps")}  # fmt: skip
    steps = alerts["SwitchyardTTFTOverSLO", "steps"]
    assert '{pool="steps"}' in steps["expr"] and steps["expr"].rstrip().endswith("> 0.15")
    assert steps["labels"]["severity"] == "ticket" and "150 ms" in steps["annotations"]["summary"]
    records = [(r["record"], r["labels"]["pool"], r["expr"]) for r in groups[1]["rules"]]
    assert [(name, pool) for name, pool, _ in records] == [
        (GOODPUT, "chat"),
        (ANSWERS, "chat"),
        (GOODPUT, "steps"),
        (ANSWERS, "steps"),
    ]
    # Chat's goodput by its TTFT bound (both spellings of the bucket), steps' by duration.
    assert (
        'sy_worker_e2e_time_to_first_token_seconds_bucket{pool="chat", le=~"1|1.0"}'
        in (records[0][2])
    )
    assert 'sy_worker_e2e_duration_seconds_bucket{pool="steps", le="0.5"}' in records[2][2]


def test_write_then_check_and_a_hand_edit_is_caught(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    shutil.copy(RULES, rules)
    slos = Slos.model_validate({"pools": {"chat": {"ttft_p99": 2.5}}})
    assert not rules_in_step(rules, slos)
    write_rules(rules, slos)
    assert rules_in_step(rules, slos)
    text = rules.read_text()
    assert "SwitchyardRouterQueueGrowing" in text  # the hand-written groups stay
    rules.write_text(text.replace("> 2.5", "> 3"))
    assert not rules_in_step(rules, slos)
    rules.write_text(text.replace("  # slo:end\n", ""))
    with pytest.raises(SloError, match="markers"):
        rules_in_step(rules, slos)


def test_the_cli_checks_writes_and_explains_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    checked = runner.invoke(app, ["metrics", "rules", "--check", "--slos", str(SLOS),
                                  "--path", str(RULES)])  # fmt: skip
    assert checked.exit_code == 0, checked.output
    rules = tmp_path / "rules.yml"
    shutil.copy(RULES, rules)
    other = slo_file(tmp_path, {"agent": {"ttft_p99": 0.3}})
    stale = runner.invoke(app, ["metrics", "rules", "--check", "--slos", str(other),
                                "--path", str(rules)])  # fmt: skip
    assert stale.exit_code == 1
    wrote = runner.invoke(app, ["metrics", "rules", "--write", "--slos", str(other),
                                "--path", str(rules)])  # fmt: skip
    assert wrote.exit_code == 0 and rules_in_step(rules, load_slos(other))
    bad = slo_file(tmp_path, {"agent": {"ttft_p99": 0.31}})
    refused = runner.invoke(app, ["metrics", "rules", "--slos", str(bad)])
    assert refused.exit_code == 2 and "not a latency bucket bound" in refused.output


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_generated_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    shutil.copy(RULES, rules)
    slos = Slos.model_validate({"pools": {
        "a": {"ttft_p99": 0.1, "duration_p99": 60.0, "goodput": "duration"},
        "b": {"ttft_p99": 0.001},
    }})  # fmt: skip
    write_rules(rules, slos)
    done = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
