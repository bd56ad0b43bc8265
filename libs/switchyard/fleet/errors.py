"""What can go wrong while a fleet starts, each error naming the service and quoting its log."""

from __future__ import annotations


class FleetError(RuntimeError):
    """A fleet, or one process of it, could not start or did not stay up."""


class ServiceExited(FleetError):
    """A service (a child process or an in-process task) ended while it should be running."""


class NotReady(FleetError):
    """The fleet did not become ready in time; the message says what was still missing."""
