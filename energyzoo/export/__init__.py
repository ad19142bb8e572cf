"""Hub-ready export: weights, configs with a complete `auto_map`, the modeling code, the tokenizer, a card."""

from .hub_folder import export_folder, export_model

__all__ = ["export_folder", "export_model"]
