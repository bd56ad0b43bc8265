"""Request and result models of both workloads, one module per concern."""
