"""`sy bench peers overhead --tls`: the benchmark's Switchyard fleet runs on a NATS that
speaks only TLS with client certificates, every process connected to it."""

from __future__ import annotations

from pathlib import Path

from switchyard.bench.peers.syfleet import switchyard_fleet


async def test_the_bench_fleet_runs_over_tls(tmp_path: Path) -> None:
    async with switchyard_fleet(
        tmp_path, workers=1, delay_scale=0.0, edge=False, tls=True
    ) as fleet:  # ready: the router and the worker are connected
        assert fleet.bus.nc._server_info.get("tls_required") is True
        assert fleet.bus.nc._server_info.get("tls_verify") is True
