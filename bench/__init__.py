"""Benchmarks: `python -m bench [name ...]` runs them and prints a summary (bench/README.md)."""
