"""`python -m services.worker`: one inference worker (one per GPU)."""

from __future__ import annotations

from functools import partial

from services.worker.service import run_worker
from services.worker.settings import WorkerSettings
from switchyard.service import run_service


def main() -> None:
    settings = WorkerSettings()
    run_service(f"worker-{settings.worker_id}", settings, partial(run_worker, settings=settings))


if __name__ == "__main__":
    main()
