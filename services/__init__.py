"""The Switchyard services: one package per process, each run as `python -m services.<name>`."""
