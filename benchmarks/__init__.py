"""Benchmarks: each module runs with ``python -m benchmarks.NAME`` and prints ratios measured side by side."""
