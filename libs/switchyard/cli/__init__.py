"""The `sy` command line."""
