"""`switchyard.probes.Probes`: a probe passes when all its checks do, and says why not.
Served on a real port by a real worker: tests/integration/test_worker_probes.py."""

from __future__ import annotations

import pytest

from switchyard.probes import Probes


def test_a_probe_names_every_check_and_why_one_fails() -> None:
    probes = Probes()
    draining = [False]
    probes.add("readyz", "bus", lambda: None)
    probes.add("readyz", "stopping", lambda: "stopping: draining" if draining[0] else None)
    assert probes.answer("readyz") == (
        True,
        {"ok": True, "checks": {"bus": "ok", "stopping": "ok"}},
    )
    draining[0] = True
    ok, body = probes.answer("readyz")
    assert not ok and body["checks"] == {"bus": "ok", "stopping": "stopping: draining"}
    assert probes.answer("healthz") == (True, {"ok": True, "checks": {}})  # nothing to fail


def test_a_broken_check_fails_its_probe_saying_so() -> None:
    probes = Probes()

    def broken() -> str | None:
        raise RuntimeError("no engine")

    probes.add("healthz", "engine", broken)
    ok, body = probes.answer("healthz")
    assert not ok and body["checks"]["engine"] == "the check failed: RuntimeError: no engine"


def test_a_check_name_is_taken_once_per_probe() -> None:
    probes = Probes()
    probes.add("readyz", "bus", lambda: None)
    probes.add("startupz", "bus", lambda: None)  # another probe: fine
    with pytest.raises(ValueError, match="already has a check named 'bus'"):
        probes.add("readyz", "bus", lambda: None)


def test_a_pending_check_holds_startup_and_readiness_until_its_event_is_set() -> None:
    probes = Probes()
    built = probes.pending("pipeline", "opening the knowledge index")
    for probe in ("startupz", "readyz"):
        assert probes.answer(probe) == (
            False, {"ok": False, "checks": {"pipeline": "opening the knowledge index"}}
        )  # fmt: skip
    assert probes.answer("healthz")[0]  # alive while it starts
    built.set()
    assert probes.answer("startupz") == (True, {"ok": True, "checks": {"pipeline": "ok"}})
    assert probes.answer("readyz")[0]
