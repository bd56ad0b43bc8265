"""Router: admission, fair scheduling and placement of generate requests onto worker partitions."""
