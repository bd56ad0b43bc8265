"""The errors capacity planning raises: inputs that cannot describe a deployment."""

from __future__ import annotations

from switchyard.errors import ErrorCode, SwitchyardError


class CapacityInputError(SwitchyardError):
    """A plan input is missing, unknown (a preset name) or out of range; `reason` says which."""

    code: ErrorCode = "invalid_request"


class ModelDoesNotFit(CapacityInputError):
    """Weights and overhead alone take all of a replica's usable memory: no KV cache at all.

    Every figure a plan derives from such a budget (concurrency, speed, GPUs) would be
    meaningless, so the plan is refused; `reason` says by how much it misses.
    """
