"""`sy bench peers`: Switchyard measured against vLLM's and SGLang's routers in one run.

- `peers`: how to launch `vllm-router` and `smg` (SGLang's gateway), and their versions;
- `simfleet`: `sy sim-server` backends; `syfleet`: a Switchyard fleet as processes (all
  of them started, checked ready and stopped by `switchyard.fleet`);
- `workload`: the requests (small chat prompts; the simulated agent steps);
- `clients`: one request per column, timed the same way (HTTP and NATS);
- `stats`: percentiles, counter deltas, hit rate, imbalance (pure functions);
- `overhead`, `routing`: the two runs; `report`: rich tables, JSON and the PNG chart.
"""
