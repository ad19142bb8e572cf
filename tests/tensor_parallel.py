"""Tensor-parallel inference of saved zoo models, as a user runs it.

Run under ``python -m torch.distributed.run --nproc_per_node P tests/tensor_parallel.py OUT FOLDER...``: each
process loads every FOLDER with ``from_pretrained(tp_plan="auto")`` (gloo on CPU), computes the logits of a
left-padded batch (`BATCH`) and its greedy continuation, and rank 0 saves ``{folder: {"logits", "generated",
"value_rows"}}`` to OUT, ``value_rows`` being the rows of layer 0's value projection this process holds (proof that
the plan sharded it).
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
        value_weight = model.model.layers[0].self_attn.v_proj.weight
        results[folder] = {**run(model), "value_rows": value_weight.to_local().shape[0]}
    if int(os.environ["RANK"]) == 0:
        torch.save(results, output)
