"""SQL validator: parses, checks and signs canonical SQL for a tenant (request/reply)."""
