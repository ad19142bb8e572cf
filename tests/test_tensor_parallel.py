"""Tensor parallelism as transformers offers it: ``from_pretrained(tp_plan="auto")`` over 2 CPU processes (torchrun,
gloo) gives the 1-process logits and greedy generations, for FEM with each prior and for TEL-GPT2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensor_parallel import held_width, run

from energyzoo import model_from_preset
from energyzoo.modeling.configuration_fem import FEM_PRIORS

pytestmark = pytest.mark.slow  # processes of their own

SCRIPT = Path(__file__).parent / "support" / "tensor_parallel.py"
VARIANTS = {  # name: (preset, overrides)
    "fem-softmax": ("fem-lm-tiny", {"prior": "softmax"}),
    "fem-gla-per-head-decay": ("fem-lm-tiny", {"prior": "gla"}),
    "fem-gla-per-channel-decay": ("fem-lm-tiny", {"prior": "gla", "gla_decay": "channel"}),
    "fem-aft-with-decay": ("fem-lm-tiny", {"prior": "aft", "aft_decay": True}),
    "fem-ssm": ("fem-lm-tiny", {"prior": "ssm"}),
    "fem-softmax-without-gates": ("fem-lm-tiny", {"prior": "softmax", "use_time_decay": False,
                                                  "use_temperature_gate": False, "use_outer_gate": False}),
    "tel-gpt2-full": ("tel-gpt2-tiny", {"tel_placement": "full"}),
}


def saved_model(folder: Path, preset: str, overrides: dict):
    """A tiny model with every parameter perturbed (zero-initialised ones too - FEM's conditioner map W_c and
    beta_max - so each channel acts differently and a misplaced shard shows), saved to ``folder``."""
    torch.manual_seed(0)
    model = model_from_preset(preset, vocab_size=120, **overrides).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return model


def test_fem_priors_and_tel_gpt2_under_tensor_parallelism_give_the_one_process_logits_and_generations(tmp_path):
    folders = {name: tmp_path / name for name in VARIANTS}
    models = {name: saved_model(folders[name], *VARIANTS[name]) for name in VARIANTS}
    expected = {name: run(model) for name, model in models.items()}
    output = tmp_path / "tensor_parallel.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(SCRIPT), str(output), *map(str, folders.values())], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    split = torch.load(output)
    for name, folder in folders.items():
        result = split[str(folder)]
        assert 2 * result["held_width"] == held_width(models[name]), name  # half of the value columns each
        torch.testing.assert_close(result["logits"], expected[name]["logits"], rtol=1e-4, atol=1e-4, msg=name)
        assert torch.equal(result["generated"], expected[name]["generated"]), name


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_the_fem_tensor_parallel_plan_names_every_split_weight_and_only_existing_ones(prior):
    """Every planned name is a module or parameter of the attention, and every projection with a head or channel
    axis (all but the SSM's shared B / C map) and every per-channel parameter of the attention is in the plan."""
    model = model_from_preset("fem-lm-tiny", prior=prior, num_hidden_layers=1, aft_decay=True)  # AFT's decay too
    attention = model.model.layers[0].self_attn
    plan = {name.removeprefix("layers.*.self_attn."): style for name, style in model.config.base_model_tp_plan.items()
            if name.startswith("layers.*.self_attn.")}
    owned = {name for name, _ in attention.named_children()}
    owned |= {name for name, _ in attention.named_parameters(recurse=False)}
    replicated = {"time_decay", "bc_proj"}  # low-rank / shared by every channel: each process holds it whole
    assert owned - replicated == set(plan)
    assert plan["o_proj"] == "rowwise" and all(style == "colwise" for name, style in plan.items() if name != "o_proj")
