"""The package as users get it, run by .ci/run in a fresh venv where energyzoo was installed from its wheel (the base
install, not editable), from a folder outside the checkout: it imports from site-packages, every preset builds (on the
meta device, so the 1.3B ones take no memory), a tiny FEM-LM generates the same tokens with and without its cache, and
its exported folder loads and generates the same in a process where energyzoo cannot be imported."""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers

import energyzoo

LOAD_WITHOUT_ENERGYZOO = """
import importlib.abc, sys, torch, transformers
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "energyzoo":
            raise ImportError("energyzoo is blocked here")
sys.meta_path.insert(0, Blocked())
folder, ids, expected = sys.argv[1], torch.load(sys.argv[2]), torch.load(sys.argv[3])
model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False), expected)
print("loaded", type(model).__module__)
"""


def main() -> None:
    installed = Path(energyzoo.__file__).resolve()
    assert "site-packages" in installed.parts, f"energyzoo imported from {installed}, not from the installed wheel"
    names = energyzoo.preset_names()
    with torch.device("meta"):
        for name in names:
            energyzoo.model_from_preset(name)
    print(f"built {len(names)} presets on the meta device")

    torch.manual_seed(0)
    model = energyzoo.model_from_preset("fem-lm-tiny").eval()
    ids = torch.randint(3, model.config.vocab_size, (1, 12))
    cached = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(cached, model.generate(ids, max_new_tokens=8, do_sample=False, use_cache=False))
    print(f"fem-lm-tiny generates with its cache on transformers {transformers.__version__}")

    with tempfile.TemporaryDirectory() as scratch:
        folder = energyzoo.export_model(model, Path(scratch) / "export")
        torch.save(ids, Path(scratch) / "ids.pt")
        torch.save(cached, Path(scratch) / "expected.pt")
        loaded = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_ENERGYZOO, str(folder), f"{scratch}/ids.pt",
                                 f"{scratch}/expected.pt"], capture_output=True, text=True, cwd=scratch, timeout=600)
        assert loaded.returncode == 0, loaded.stderr[-3000:]
        print(f"the export {loaded.stdout.strip()} and generates the same tokens")


if __name__ == "__main__":
    main()
