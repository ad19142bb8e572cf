"""Write a folder that loads with `trust_remote_code=True` on a machine without energyzoo."""

from pathlib import Path

from ..registry import auto_map_for


def export_model(model, output_dir: str | Path, tokenizer=None) -> Path:
    """Save ``model`` (and ``tokenizer``) so that every Auto class its architecture supports can load the
    folder as remote code: safetensors weights, config.json with a full `auto_map`, the generation config
    and the modeling files (copied by transformers through `register_for_auto_class`)."""
    output_dir = Path(output_dir)
    model.config.auto_map = auto_map_for(model.config.model_type)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return output_dir
