"""Hub-ready export: weights, configs with a complete `auto_map`, the modeling code, the tokenizer."""

from .export import export_model

__all__ = ["export_model"]
