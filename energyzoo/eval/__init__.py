"""Evaluation: speed benchmarks (and, later, lm-eval integration and synthetic benchmarks)."""
