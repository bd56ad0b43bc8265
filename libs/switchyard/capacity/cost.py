"""GPU cost per million tokens ([S2] §3.4).

    cost / 1M = price per GPU-hour × GPUs × 10^6 / (tokens/s × 3600 × U)

U is the average utilisation: an idle GPU is billed too, so at U = 0.3 a token
costs 3.3× its full-load price. Only GPUs are counted (no CPU, network, storage,
people).
"""

from __future__ import annotations

from switchyard.capacity.errors import CapacityInputError


def cost_per_million_tokens(
    price_per_gpu_hour: float, gpus: int, tokens_per_s: float, utilisation: float = 1.0
) -> float:
    if price_per_gpu_hour < 0 or gpus < 1:
        raise CapacityInputError("price must be ≥ 0 and gpus ≥ 1")
    if tokens_per_s <= 0:
        raise CapacityInputError("throughput must be > 0 tokens/s to price a token")
    if not 0 < utilisation <= 1:
        raise CapacityInputError(f"utilisation must be in (0, 1], got {utilisation}")
    return price_per_gpu_hour * gpus * 1e6 / (tokens_per_s * 3600 * utilisation)


def cost_per_thousand_requests(
    price_per_gpu_hour: float, gpus: int, requests_per_s: float, utilisation: float = 1.0
) -> float:
    """The same bill per 1,000 requests: the agent's unit (16-token answers, long prompts)."""
    return cost_per_million_tokens(price_per_gpu_hour, gpus, requests_per_s, utilisation) / 1000
