"""Evaluation through lm-evaluation-harness: the suites (`suites`, read without torch) and their runs on a model
folder (`harness`)."""
