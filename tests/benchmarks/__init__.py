"""Benchmarks: scripts that print figures, side by side with another tool or the model (run on demand, never
pass/fail). `python -m tests.benchmarks.run_all --out bench-results/` runs them all into one table."""
