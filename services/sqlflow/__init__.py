"""SQL flow: turns a question into validated, executed SQL and a summary (Text2SQL)."""
