"""The worker's GPU telemetry, read through NVML (`nvidia-ml-py`, the `gpu` extra).

Which GPUs: the worker's `gpus` setting (`SY_GPUS`), by default what CUDA_VISIBLE_DEVICES
names (NVML indices or GPU UUIDs; "0" when it is unset: in a container given one GPU,
that GPU). An index is NVML's, in PCI bus order; CUDA's is the same only with
CUDA_DEVICE_ORDER=PCI_BUS_ID, so a UUID is the unambiguous way to name one.

No library or no driver: `open` says so in one log line and returns None; the worker
runs on without GPU metrics. A field the GPU does not report (power on some boards,
PCIe throughput in a VM) is left out of its readings, logged once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from switchyard.logging import get_logger

log = get_logger(__name__)

Reader = Callable[[Any, Any], float]

# Field (`sy_gpu_<field>`) -> (what it is, how NVML reads it: nvml module, device handle).
# NVML's units become base units: percent -> ratio, MHz -> Hz, mW -> W, KB/s -> bytes/s.
FIELDS: dict[str, tuple[str, Reader]] = {
    "utilization_ratio": (
        "Fraction of the last sample period in which a kernel ran on the GPU (NVML)",
        lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100,
    ),
    "memory_used_bytes": (
        "GPU memory in use (NVML)",
        lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used,
    ),
    "memory_total_bytes": (
        "GPU memory installed (NVML)",
        lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).total,
    ),
    "sm_clock_hertz": (
        "SM clock (NVML)",
        lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
    ),
    "power_watts": ("Power draw (NVML)", lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000),
    "temperature_celsius": (
        "GPU die temperature (NVML)",
        lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
    ),
    "pcie_tx_bytes_per_second": (
        "PCIe bytes sent by the GPU per second, over NVML's 20 ms sample",
        lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024,
    ),
    "pcie_rx_bytes_per_second": (
        "PCIe bytes received by the GPU per second, over NVML's 20 ms sample",
        lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024,
    ),
}


@dataclass(frozen=True)
class GpuReading:
    gpu: str  # NVML index
    uuid: str
    values: dict[str, float]  # field -> value, for the fields the GPU reports


class GpuTelemetry:
    """NVML, opened on the worker's GPUs. `read` blocks (PCIe throughput samples for
    20 ms per direction): the heartbeat runs it in a thread."""

    def __init__(self, nvml: Any, devices: list[tuple[str, str, Any]]) -> None:
        self.nvml = nvml
        self.devices = devices  # (index, uuid, handle)
        self._unreadable: set[tuple[str, str]] = set()  # (gpu, field) logged once

    @classmethod
    def open(cls, gpus: list[str], nvml: Any = None) -> GpuTelemetry | None:
        """NVML on `gpus` (indices or UUIDs); None, logged once, where there is none.
        `nvml`: the module to use (default `pynvml`, imported here)."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                log.info("worker.gpu_metrics_off", reason="nvidia-ml-py is not installed")
                return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.info("worker.gpu_metrics_off", reason=f"NVML did not start: {exc}")
            return None
        devices = []
        missing = []
        for name in gpus:
            try:
                handle = (
                    nvml.nvmlDeviceGetHandleByIndex(int(name)) if name.isdigit()
                    else nvml.nvmlDeviceGetHandleByUUID(name)
                )  # fmt: skip
                index = str(nvml.nvmlDeviceGetIndex(handle))
                devices.append((index, str(nvml.nvmlDeviceGetUUID(handle)), handle))
            except nvml.NVMLError as exc:
                missing.append(f"{name}: {exc}")
        if not devices:
            nvml.nvmlShutdown()
            why = "; ".join(missing) or "no GPU is visible to this worker"
            log.info("worker.gpu_metrics_off", reason=f"no GPU found ({why})", gpus=gpus)
            return None
        log.info("worker.gpu_metrics", gpus=[d[:2] for d in devices], missing=missing)
        return cls(nvml, devices)

    def read(self) -> list[GpuReading]:
        readings = []
        for index, uuid, handle in self.devices:
            values: dict[str, float] = {}
            for field, (_, reader) in FIELDS.items():
                try:
                    values[field] = float(reader(self.nvml, handle))
                except self.nvml.NVMLError as exc:
                    if (index, field) not in self._unreadable:
                        self._unreadable.add((index, field))
                        log.info("worker.gpu_field_unreadable", gpu=index, field=field,
                                 error=str(exc))  # fmt: skip
            readings.append(GpuReading(index, uuid, values))
        return readings

    def close(self) -> None:
        self.nvml.nvmlShutdown()
