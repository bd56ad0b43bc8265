"""`python -m services.worker`: one inference worker (one per GPU)."""

from __future__ import annotations

from functools import partial

from services.worker.service import run_worker
from services.worker.settings import WorkerSettings
from switchyard.probes import Probes
from switchyard.service import run_service


def main() -> None:
    settings = WorkerSettings()
    probes = Probes()  # the service's checks and the worker's, on its metrics port
    worker = partial(run_worker, settings=settings, probes=probes)
    run_service(f"worker-{settings.worker_id}", settings, worker, probes)


if __name__ == "__main__":
    main()
