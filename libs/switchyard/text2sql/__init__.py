"""Text2SQL: tenant knowledge, its index, the SELECT grammar, the answering pipeline
and its evaluation. The orchestrator process is `services/sqlflow`."""
