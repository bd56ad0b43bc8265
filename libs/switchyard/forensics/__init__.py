"""Explaining requests after the fact: `sy trace` and `sy replay`."""
