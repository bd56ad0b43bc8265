"""The database side of Text2SQL: demo data, tenant walls, and the executor's core."""
