"""`sy bench peers`: Switchyard measured against vLLM's and SGLang's routers in one run.

- `procs`: child processes with logs, readiness checks and a teardown that always runs;
- `peers`: how to launch `vllm-router` and `smg` (SGLang's gateway), and their versions;
- `simfleet`: `sy sim-server` backends; `syfleet`: a Switchyard fleet as processes;
- `workload`: the requests (small chat prompts; the simulated agent steps);
- `clients`: one request per column, timed the same way (HTTP and NATS);
- `stats`: percentiles, counter deltas, hit rate, imbalance (pure functions);
- `overhead`, `routing`: the two runs; `report`: rich tables, JSON and the PNG chart.
"""
