"""Inference engines behind one protocol: `vllm` (GPU), `llamacpp` (CPU), `sim` (simulator)."""
