"""Tensor-parallel inference of saved zoo models, as a user runs it.

Run under ``python -m torch.distributed.run --nproc_per_node P tests/support/tensor_parallel.py OUT FOLDER...``: each
process loads every FOLDER with ``from_pretrained(tp_plan="auto")`` (gloo on CPU), computes the logits of a
left-padded batch (`BATCH`) and its greedy continuation, and rank 0 saves ``{folder: {"logits", "generated",
"held_width"}}`` to OUT, ``held_width`` being the output columns of the first attention's value map (FEM's v_proj,
GPT-2's packed c_attn) this process holds: proof that the plan split it.
"""

import os
import sys

import torch
from transformers import AutoModelForCausalLM

import energyzoo  # noqa: F401  (registers the zoo with the Auto classes)

NEW_TOKENS = 4


def batch(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(4, vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, ordinary tokens under it
    return ids, mask


def held_width(model) -> int:
    """Output columns of the first attention's value map (FEM's v_proj, GPT-2's packed c_attn) on this process."""
    weight = (model.transformer.h[0].attn.c_attn if model.config.model_type == "tel-gpt2"
              else model.model.layers[0].self_attn.v_proj).weight
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    return local.shape[1] if model.config.model_type == "tel-gpt2" else local.shape[0]  # Conv1D is (in, out)


def run(model) -> dict[str, torch.Tensor]:
    ids, mask = batch(model.config.vocab_size)
    with torch.no_grad():
        return {"logits": model(input_ids=ids, attention_mask=mask).logits,
                "generated": model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)}


if __name__ == "__main__":
    torch.set_num_threads(1)
    output, folders = sys.argv[1], sys.argv[2:]
    results = {}
    for folder in folders:
        model = AutoModelForCausalLM.from_pretrained(folder, tp_plan="auto").eval()
        results[folder] = {**run(model), "held_width": held_width(model)}
    if int(os.environ["RANK"]) == 0:
        torch.save(results, output)
