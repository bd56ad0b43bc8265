"""`sy sim-server` as a real process: OpenAI shape (streaming and not), models, health,
vLLM's metric names, and prefix-cache counters that grow on a repeated prompt."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from switchyard.bench.peers.stats import HITS, QUERIES, parse_metrics
from switchyard.bench.routeload import ACTION_SCHEMA, AgentStep
from switchyard.fleet import ProcessGroup
from switchyard.ports import free_port
from switchyard.simserver.frames import frame_marker

VLLM_NAMES = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)
LONG = "The agent opens the shop, buys a sword and returns to the map. " * 12


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    with ProcessGroup(Path(tmp_path_factory.mktemp("simserver"))) as group:
        child = group.start("sim", [sys.executable, "-m", "switchyard.cli.app", "sim-server",
                                    "--port", str(port), "--delay-scale", "0"])  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        group.wait_http(child, f"{url}/health", timeout=60)
        yield url


@pytest.fixture
def client(sim_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim_url}/v1", api_key="unused", max_retries=0)


def metrics(url: str) -> dict[str, float]:
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200
    return parse_metrics(r.text)


def test_health_and_models(sim_url: str, client: openai.OpenAI) -> None:
    assert httpx.get(f"{sim_url}/health").status_code == 200
    assert [m.id for m in client.models.list().data] == ["sim"]


def test_non_streaming_completion_has_openai_shape(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "Say hi"}], max_tokens=7,
        temperature=0,
    )  # fmt: skip
    assert out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert out.usage is not None
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens > 2
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Describe the shop screen."}]
    whole = client.chat.completions.create(
        model="sim",
        messages=messages,
        max_tokens=9,
        temperature=0,  # type: ignore[arg-type]
    )
    stream = client.chat.completions.create(
        model="sim", messages=messages, max_tokens=9, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_json_schema_answer_is_valid_json(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "Next action?"}], max_tokens=48,
        temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "action", "schema": ACTION_SCHEMA}},
    )  # fmt: skip
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_bad_requests_are_openai_400s(sim_url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sim", messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:  # longer than the context window
        client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}], max_tokens=32768
        )
    assert "context window" in str(e.value)
    r = httpx.post(f"{sim_url}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400
    assert "error" in r.json()


def test_frame_markers_cost_visual_tokens(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "look"}], max_tokens=1
    )
    marker = frame_marker("ab" * 16, 1280, 720)
    framed = client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "look" + marker}], max_tokens=1
    )
    assert plain.usage is not None and framed.usage is not None
    # The default profile, qwen3-vl: one visual token per 32x32 px, so 1280x720 costs
    # 921,600 / 1,024 = 900 visual tokens, plus the two vision delimiters.
    assert framed.usage.prompt_tokens - plain.usage.prompt_tokens == 902


def test_metrics_use_vllm_names_and_prefix_hits_grow(sim_url: str, client: openai.OpenAI) -> None:
    before = metrics(sim_url)
    for name in VLLM_NAMES:
        assert name in before, name
    first = client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": LONG}], max_tokens=2
    )
    middle = metrics(sim_url)
    client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": LONG}], max_tokens=2
    )
    after = metrics(sim_url)
    assert first.usage is not None
    prompt = first.usage.prompt_tokens
    assert middle[QUERIES] - before[QUERIES] == prompt
    assert after[QUERIES] - middle[QUERIES] == prompt
    # The repeat hits every full 16-token block but the one holding the last prompt token.
    assert after[HITS] - middle[HITS] == ((prompt - 1) // 16) * 16
    assert middle[HITS] - before[HITS] < after[HITS] - middle[HITS]
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 4
    assert after["sim:busy_seconds_total"] > before["sim:busy_seconds_total"]
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1


def test_agent_steps_share_a_prefix_and_reset_makes_it_cold(sim_url: str) -> None:
    http = httpx.Client(base_url=sim_url, timeout=30)
    assert http.post("/sim/reset").status_code == 200
    zero = metrics(sim_url)
    assert zero[QUERIES] == 0 and zero[HITS] == 0
    step0 = AgentStep(seed=1, session=3, step=0, history=())
    r0 = http.post("/v1/chat/completions", json=step0.openai_body("sim", stream=False),
                   headers=step0.headers())  # fmt: skip
    assert r0.status_code == 200, r0.text
    answer = r0.json()["choices"][0]["message"]["content"]
    step1 = AgentStep(seed=1, session=3, step=1, history=(answer,))
    r1 = http.post("/v1/chat/completions", json=step1.openai_body("sim", stream=False))
    assert r1.status_code == 200
    after = metrics(sim_url)
    # Step 1 reuses the system prompt and the start of the history from step 0.
    assert after[HITS] >= 200
    timings = http.get("/sim/timings").json()
    assert [t["request_id"] for t in timings] == [
        r0.json()["id"].removeprefix("chatcmpl-"),
        r1.json()["id"].removeprefix("chatcmpl-"),
    ]
    assert timings[1]["cached_tokens"] == after[HITS]


def test_gpu_preset_labels_the_calibration_and_every_timing(tmp_path: Path) -> None:
    from switchyard.capacity.calibration import sim_calibration

    port = free_port()
    with ProcessGroup(tmp_path) as group:
        child = group.start("sim", [sys.executable, "-m", "switchyard.cli.app", "sim-server",
                                    "--port", str(port), "--delay-scale", "0",
                                    "--gpu", "rtx5090"])  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        group.wait_http(child, f"{url}/health", timeout=60)
        http = httpx.Client(base_url=url, timeout=30)
        cal = http.get("/sim/calibration").json()
        assert (cal["calibration"], cal["gpu"], cal["overridden"]) == ("rtx5090", "rtx5090", [])
        assert cal["figures"] == sim_calibration("rtx5090").settings() == cal["preset_figures"]
        body = {"model": "sim", "messages": [{"role": "user", "content": LONG}], "max_tokens": 3}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        timings = http.get("/sim/timings").json()
    assert [t["calibration"] for t in timings] == ["rtx5090"]


def test_an_unknown_gpu_preset_is_refused_with_the_choices() -> None:
    from typer.testing import CliRunner

    from switchyard.cli.app import app

    result = CliRunner().invoke(app, ["sim-server", "--gpu", "b200", "--port", "1"])
    assert result.exit_code == 2
    assert "a100, h100, rtx5090" in result.output
