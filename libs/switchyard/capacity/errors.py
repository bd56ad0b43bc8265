"""The one error capacity planning raises: an input that cannot describe a deployment."""

from __future__ import annotations

from switchyard.errors import ErrorCode, SwitchyardError


class CapacityInputError(SwitchyardError):
    """A plan input is missing, unknown (a preset name) or out of range; `reason` says which."""

    code: ErrorCode = "invalid_request"
