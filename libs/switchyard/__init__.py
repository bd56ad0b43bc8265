"""Switchyard's shared library: messages, bus, partitioning, settings, logs and metrics."""

__version__ = "0.1.0"
