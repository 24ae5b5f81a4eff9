"""trioworker's benchmarks: `python -m bench SCENARIO` (see docs/benchmarks.md).

Each scenario prints a table and writes JSON to bench/results/. Figures that compare
two things are always measured side by side in one run; absolute times on a small,
shared machine are not worth comparing across runs.
"""
