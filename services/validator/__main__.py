"""`python -m services.validator`: the SQL validator (a pure function with a signing key)."""

from __future__ import annotations

from functools import partial

from services.validator.service import run_validator
from services.validator.settings import ValidatorSettings
from switchyard.service import run_service


def main() -> None:
    settings = ValidatorSettings()
    run_service("validator", settings, partial(run_validator, settings=settings))


if __name__ == "__main__":
    main()
