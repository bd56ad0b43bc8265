"""`python -m services.router`: admission, fair scheduling and placement."""

from __future__ import annotations

from functools import partial

from services.router.service import run_router
from services.router.settings import RouterSettings
from switchyard.service import run_service


def main() -> None:
    settings = RouterSettings()
    run_service(f"router-{settings.router_id}", settings, partial(run_router, settings=settings))


if __name__ == "__main__":
    main()
