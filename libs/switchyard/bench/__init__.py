"""Benchmarks behind `sy bench`: measured side by side in one run, reported as medians."""
