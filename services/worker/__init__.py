"""Worker: runs generate requests of its partitions on one inference engine (one per GPU)."""
