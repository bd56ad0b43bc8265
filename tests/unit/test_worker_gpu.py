"""The worker's GPU telemetry (services/worker/gpu.py) and its `sy_gpu_*` metrics.

This machine has no NVML (no nvidia-ml-py, no driver): the first test is the real
absence path. Beside it, a fake NVML module (pynvml's function names, fixed figures)
proves what a GPU's readings are exported as.
"""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from services.worker.gpu import FIELDS, GpuTelemetry
from services.worker.metrics import GpuExporter

pytestmark = pytest.mark.unit


def test_without_nvml_there_is_no_telemetry_and_one_log_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    why = "nvidia-ml-py is not installed"
    if importlib.util.find_spec("pynvml") is not None:  # the library without a driver
        why = "NVML did not start"
    gpu = GpuTelemetry.open(["0"])
    if gpu is not None:
        gpu.close()
        pytest.skip("this machine has a GPU driver: the absence path is not its own")
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "gpu_metrics" in line]
    assert len(lines) == 1 and "worker.gpu_metrics_off" in lines[0] and why in lines[0]
    exporter = GpuExporter()
    registry = CollectorRegistry()
    registry.register(exporter)
    assert not [f for f in registry.collect() if f.samples]  # no reading: nothing exported


class FakeNvmlError(Exception):
    pass


def fake_nvml(*, driver: bool = True, power: bool = True) -> Any:
    """pynvml's names over two GPUs with fixed figures (NVML's own units)."""
    uuids = ["GPU-aaaa", "GPU-bbbb"]

    def init() -> None:
        if not driver:
            raise FakeNvmlError("Driver Not Loaded")

    def by_index(i: int) -> int:
        if i >= len(uuids):
            raise FakeNvmlError("Invalid Argument")
        return i

    def by_uuid(u: str) -> int:
        if u not in uuids:
            raise FakeNvmlError("Not Found")
        return uuids.index(u)

    def power_usage(h: int) -> int:
        if not power:
            raise FakeNvmlError("Not Supported")
        return 350_000 + h  # mW

    def pcie(h: int, counter: int) -> int:
        return {10: 2_000, 11: 3_000}[counter]  # KB/s

    return types.SimpleNamespace(
        NVMLError=FakeNvmlError, NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0,
        NVML_PCIE_UTIL_TX_BYTES=10, NVML_PCIE_UTIL_RX_BYTES=11,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=by_index, nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetIndex=lambda h: h, nvmlDeviceGetUUID=lambda h: uuids[h],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=60 << 30, total=80 << 30),
        nvmlDeviceGetClockInfo=lambda h, clock: 1980 if clock == 1 else 0,
        nvmlDeviceGetPowerUsage=power_usage,
        nvmlDeviceGetTemperature=lambda h, sensor: 64 if sensor == 0 else -1,
        nvmlDeviceGetPcieThroughput=pcie,
    )  # fmt: skip


def test_readings_are_exported_under_catalog_names_in_base_units() -> None:
    gpu = GpuTelemetry.open(["1"], nvml=fake_nvml())
    assert gpu is not None
    exporter = GpuExporter()
    registry = CollectorRegistry()
    registry.register(exporter)
    exporter.update(gpu.read())
    labels = {"gpu": "1", "UUID": "GPU-bbbb"}
    got = {f: registry.get_sample_value(f"sy_gpu_{f}", labels) for f in FIELDS}
    assert got == {
        "utilization_ratio": 0.87,
        "memory_used_bytes": 60 << 30,
        "memory_total_bytes": 80 << 30,
        "sm_clock_hertz": 1.98e9,
        "power_watts": 350.001,
        "temperature_celsius": 64,
        "pcie_tx_bytes_per_second": 2_000 * 1024,
        "pcie_rx_bytes_per_second": 3_000 * 1024,
    }
    assert registry.get_sample_value("sy_gpu_power_watts", {"gpu": "0", "UUID": "GPU-aaaa"}) is None


def test_gpus_by_uuid_a_missing_one_skipped_an_unsupported_field_left_out(
    capfd: pytest.CaptureFixture[str],
) -> None:
    gpu = GpuTelemetry.open(["GPU-aaaa", "7"], nvml=fake_nvml(power=False))
    assert gpu is not None and [d[:2] for d in gpu.devices] == [("0", "GPU-aaaa")]
    for _ in range(3):
        (reading,) = gpu.read()
    assert reading.gpu == "0" and "power_watts" not in reading.values
    assert set(reading.values) == set(FIELDS) - {"power_watts"}
    out, err = capfd.readouterr()
    logged = out + err
    assert logged.count("worker.gpu_field_unreadable") == 1  # once, not every beat
    assert "7: Invalid Argument" in logged


def test_no_driver_or_no_gpu_found_is_telemetry_off_with_one_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert GpuTelemetry.open(["0"], nvml=fake_nvml(driver=False)) is None
    assert GpuTelemetry.open(["GPU-zzzz"], nvml=fake_nvml()) is None
    assert GpuTelemetry.open([], nvml=fake_nvml()) is None  # CUDA_VISIBLE_DEVICES=""
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "gpu_metrics" in line]
    assert len(lines) == 3 and all("worker.gpu_metrics_off" in line for line in lines)
    assert "Driver Not Loaded" in lines[0] and "GPU-zzzz: Not Found" in lines[1]
    assert "no GPU is visible" in lines[2]


def test_which_gpus_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.worker.settings import WorkerSettings

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert WorkerSettings().gpus == ["0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-aaaa")
    assert WorkerSettings().gpus == ["2", "GPU-aaaa"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert WorkerSettings().gpus == []
    monkeypatch.setenv("SY_GPUS", '["GPU-bbbb"]')
    assert WorkerSettings().gpus == ["GPU-bbbb"]
