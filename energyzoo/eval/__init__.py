"""Evaluation: lm-evaluation-harness suites (`harness`) and the speed benchmark (`speed`)."""
