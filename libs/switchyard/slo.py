"""Per-pool latency SLOs (deploy/prometheus/slos.yml) and the Prometheus rules made from
them: an alert per pool and objective, and the goodput recording rules.

An agent step, a chat and a SQL generation promise different latencies, so each pool
has its own objectives, as p99s of the end-to-end histograms the workers export (request
creation -> first token, -> last token). Each bound must be a bucket bound of those
histograms (`LATENCY_BUCKETS`): goodput counts the answers in the bucket at the bound, so
a bound between buckets would be counted wrongly. `sy metrics rules --write` puts the
rules between the markers of deploy/prometheus/rules.yml, `--check` fails when they
differ from what slos.yml makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from switchyard.metrics import LATENCY_BUCKETS

BEGIN = "  # slo:begin (generated from slos.yml by `sy metrics rules --write`)"
END = "  # slo:end"
WINDOW = "5m"  # the rate window of every generated rule, and how long an alert must hold

TTFT = "sy_worker_e2e_time_to_first_token_seconds"
DURATION = "sy_worker_e2e_duration_seconds"
GOODPUT = "pool:sy_worker_goodput_requests:rate5m"  # answers within the pool's SLO, per s
ANSWERS = "pool:sy_worker_answers:rate5m"  # all answers, per s

PoolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class SloError(ValueError):
    """The SLO file cannot be read, or says something invalid; the message says where."""


class PoolSlo(BaseModel):
    """One pool's objectives, p99 seconds; `goodput` names the one goodput is judged by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p99: float
    duration_p99: float | None = None
    goodput: Literal["ttft", "duration"] = "ttft"
    severity: Literal["page", "ticket"] = "page"

    @model_validator(mode="after")
    def _consistent(self) -> PoolSlo:
        for name, bound in (("ttft_p99", self.ttft_p99), ("duration_p99", self.duration_p99)):
            if bound is not None and bound not in LATENCY_BUCKETS:
                bounds = ", ".join(f"{b:g}" for b in LATENCY_BUCKETS)
                raise ValueError(f"{name} {bound:g} s is not a latency bucket bound ({bounds})")
        if self.duration_p99 is not None and self.duration_p99 < self.ttft_p99:
            raise ValueError("duration_p99 is shorter than ttft_p99")
        if self.goodput == "duration" and self.duration_p99 is None:
            raise ValueError("goodput by duration needs a duration_p99")
        return self


class Slos(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pools: Annotated[dict[PoolName, PoolSlo], Field(min_length=1)]


def load_slos(path: Path) -> Slos:
    """The SLOs in `path`; `SloError` names the file and the field that is wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SloError(f"{path}: {exc}") from None
    try:
        return Slos.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'the file'}: {e['msg']}" for e in exc.errors()
        )
        raise SloError(f"{path}: {problems}") from None


def _le(bound: float) -> str:
    """A matcher of the bucket at `bound` under both spellings: prometheus_client writes
    `1.0`, Prometheus 3 normalises it to `1` (0.25 is written alike by both)."""
    python, go = repr(float(bound)), f"{bound:g}"
    return f'le="{go}"' if python == go else f'le=~"{go}|{python}"'


def _human(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"


def _alert(pool: str, slo: PoolSlo, name: str, metric: str, bound: float, what: str) -> str:
    return f"""      - alert: {name}
        expr: |
          histogram_quantile(0.99,
            sum by (le, pool) (rate({metric}_bucket{{pool="{pool}"}}[{WINDOW}]))
          ) > {bound:g}
        for: {WINDOW}
        labels:
          severity: {slo.severity}
          pool: {pool}
        annotations:
          summary: "p99 {what} of pool {{{{ $labels.pool }}}} is over its {_human(bound)} SLO"
          description: >-
            p99 {what} in pool {{{{ $labels.pool }}}} has been
            {{{{ $value | humanizeDuration }}}} for {WINDOW}; sy_worker_phase_seconds
            shows which phase grew (router queue, dispatch, engine queue, prefill, decode).
"""


def _goodput(pool: str, slo: PoolSlo) -> str:
    metric, bound = (
        (DURATION, slo.duration_p99) if slo.goodput == "duration" and slo.duration_p99
        else (TTFT, slo.ttft_p99)
    )  # fmt: skip
    # The `pool` label also tells apart the pools' rules of one name (promtool's lint).
    return f"""      - record: {GOODPUT}
        expr: sum by (pool) (rate({metric}_bucket{{pool="{pool}", {_le(bound)}}}[{WINDOW}]))
        labels:
          pool: {pool}
      - record: {ANSWERS}
        expr: sum by (pool) (rate({metric}_count{{pool="{pool}"}}[{WINDOW}]))
        labels:
          pool: {pool}
"""


def render_rules(slos: Slos) -> str:
    """The generated groups, as they stand between the markers of rules.yml."""
    alerts, goodput = [], []
    for pool, slo in sorted(slos.pools.items()):
        alerts.append(
            _alert(pool, slo, "SwitchyardTTFTOverSLO", TTFT, slo.ttft_p99, "end-to-end TTFT")
        )
        if slo.duration_p99 is not None:
            alerts.append(_alert(pool, slo, "SwitchyardDurationOverSLO", DURATION,
                                 slo.duration_p99, "end-to-end duration"))  # fmt: skip
        goodput.append(_goodput(pool, slo))
    return (
        "  - name: switchyard-slo\n    rules:\n" + "".join(alerts)
        + "\n  - name: switchyard-goodput\n    rules:\n" + "".join(goodput)
    )  # fmt: skip


def _split(text: str, path: Path) -> tuple[str, str, str]:
    head, begin, rest = text.partition(BEGIN + "\n")
    body, end, tail = rest.partition(END + "\n")
    if not begin or not end:
        raise SloError(f"{path}: no `{BEGIN.strip()}` ... `{END.strip()}` markers")
    return head, body, tail


def write_rules(path: Path, slos: Slos) -> None:
    head, _, tail = _split(path.read_text(), path)
    path.write_text(f"{head}{BEGIN}\n{render_rules(slos)}{END}\n{tail}")


def rules_in_step(path: Path, slos: Slos) -> bool:
    """Whether the rules between the markers of `path` are those `slos` makes."""
    return _split(path.read_text(), path)[1] == render_rules(slos)
