"""State dicts in the layouts of the authors' Hyper-SET checkpoints (`hyperset_original_layouts.json`: key names and
shapes of each of their models), with random values, saved as their trainers save them: the input of `energyzoo
convert hyperset-original` in tests."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

LAYOUTS = json.loads((Path(__file__).parent / "hyperset_original_layouts.json").read_text())


def original_state(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict in the authors' layout ``name`` (the JSON's key names and shapes), random values."""
    layout = LAYOUTS[name]
    dims = layout["dims"]
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for pattern, shape in layout["keys"].items():
        sizes = [dims[s[1:]] * 2 if isinstance(s, str) and s.startswith("2") else dims.get(s, s) for s in shape]
        keys = {pattern.format(i=i, r=r) for i in range(dims.get("layers", 1)) for r in range(dims.get("R", 1))}
        for key in sorted(keys):
            if key.endswith("attn.mask"):
                state[key] = torch.ones(sizes).tril()
            else:
                state[key] = (torch.randn(sizes, generator=generator) * 0.3 + (1.0 if len(sizes) == 1 else 0.0))
    return state


def saved_original(tmp_path: Path, name: str, suffix: str = ".pth") -> Path:
    """The layout's state dict saved as the authors' trainer saves it (``{"model_state_dict": ...}`` or bare)."""
    state = original_state(name)
    path = tmp_path / f"{name}{suffix}"
    if suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save({"model_state_dict": state, "epoch": 3} if LAYOUTS[name]["format"] == "model_state_dict" else state,
                   path)
    return path
