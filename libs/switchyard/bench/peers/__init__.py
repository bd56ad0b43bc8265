"""`sy bench peers`: Switchyard measured against vLLM's and SGLang's routers in one run.

- `peers`: how to launch `vllm-router` and `smg` (SGLang's gateway), and their versions;
- `simfleet`: `sy sim-server` backends; `syfleet`: a Switchyard fleet as processes (all
  of them started, checked ready and stopped by `switchyard.fleet`);
- the requests: `sy bench edge`'s short chat prompts (`bench.engine.numbered_messages`) for
  the overhead run, `sy bench route`'s workloads (`bench.routeload`) for the routing run;
- `clients`: one request per column, timed the same way (HTTP and NATS);
- `stats`: percentiles, counter deltas, hit rate, imbalance (pure functions);
- `overhead`, `routing`: the two runs; `report`: rich tables, JSON and the PNG chart.
"""
