"""`sy sim-server`: one `sim` engine behind an OpenAI-compatible HTTP API with vLLM's metrics.

A simulator, not a model: it answers in the shape asked for (see `engines/sim.py`), so any
router that fronts vLLM (vllm-router, SGLang's gateway) can front it, and the prefix-cache
counters it exports under vLLM's own names say how well that router kept sessions warm.
"""
