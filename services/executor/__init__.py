"""SQL executor: runs signed canonical SQL (after an EXPLAIN gate); holds the DB credentials."""
