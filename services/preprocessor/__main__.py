"""`python -m services.preprocessor`: ingress -> prepared, schedulable requests."""

from __future__ import annotations

from functools import partial

from services.preprocessor.service import run_preprocessor
from services.preprocessor.settings import PreprocessorSettings
from switchyard.service import run_service


def main() -> None:
    settings = PreprocessorSettings()
    run_service("preprocessor", settings, partial(run_preprocessor, settings=settings))


if __name__ == "__main__":
    main()
