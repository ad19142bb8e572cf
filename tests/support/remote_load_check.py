"""Run in a fresh process by the contract suite: load an exported folder as remote code with energyzoo
made impossible to import, and check it reproduces the outputs (and generations) saved by the test."""

import importlib.abc
import sys


class BlockEnergyzoo(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "energyzoo" or name.startswith("energyzoo."):
            raise ImportError("energyzoo is blocked in this process")
        return None


sys.meta_path.insert(0, BlockEnergyzoo())

import torch  # noqa: E402
import transformers  # noqa: E402

folder, payload_path = sys.argv[1:3]
payload = torch.load(payload_path, weights_only=False)
model = getattr(transformers, payload["auto_class"]).from_pretrained(folder, trust_remote_code=True).eval()
try:
    import energyzoo  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("energyzoo was importable")
with torch.no_grad():
    outputs = model(**payload["inputs"])
result = outputs.logits if getattr(outputs, "logits", None) is not None else outputs.last_hidden_state
torch.testing.assert_close(result, payload["expected"], rtol=1e-5, atol=1e-5)
if "generated" in payload:
    generated = model.generate(**payload["inputs"], **payload["generation"])
    assert torch.equal(generated, payload["generated"]), (generated, payload["generated"])
print("REMOTE_OK", type(model).__module__, transformers.__version__)
