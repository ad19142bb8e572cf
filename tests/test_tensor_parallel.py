"""Tensor parallelism as transformers offers it: ``from_pretrained(tp_plan="auto")`` over 2 CPU processes (torchrun,
gloo) gives the 1-process logits and greedy generations, for FEM with each prior."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from energyzoo import model_from_preset

sys.path.insert(0, str(Path(__file__).parent))
from tensor_parallel import run  # noqa: E402

SCRIPT = Path(__file__).with_name("tensor_parallel.py")
FEM_VARIANTS = {
    "softmax": {"prior": "softmax"},
    "gla-per-head-decay": {"prior": "gla"},
    "gla-per-channel-decay": {"prior": "gla", "gla_decay": "channel"},
    "aft-with-decay": {"prior": "aft", "aft_decay": True},
    "ssm": {"prior": "ssm"},
    "softmax-without-gates": {"prior": "softmax", "use_time_decay": False, "use_temperature_gate": False,
                              "use_outer_gate": False},
}


def saved_model(folder: Path, overrides: dict):
    """A tiny FEM-LM with every parameter perturbed (the zero-initialised conditioner map W_c and beta_max too,
    so each channel's modulator and temperature differ and a misplaced shard shows), saved to ``folder``."""
    torch.manual_seed(0)
    model = model_from_preset("fem-lm-tiny", vocab_size=120, num_hidden_layers=2, **overrides).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return model


def test_every_fem_prior_under_tensor_parallelism_gives_the_one_process_logits_and_generations(tmp_path):
    folders = {name: tmp_path / name for name in FEM_VARIANTS}
    expected = {name: run(saved_model(folders[name], overrides)) for name, overrides in FEM_VARIANTS.items()}
    output = tmp_path / "tensor_parallel.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(SCRIPT), str(output), *map(str, folders.values())], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    sharded = torch.load(output)
    for name, folder in folders.items():
        result = sharded[str(folder)]
        assert result["value_rows"] == 32, name  # half of the 64 value channels: the plan did shard
        torch.testing.assert_close(result["logits"], expected[name]["logits"], rtol=1e-4, atol=1e-4, msg=name)
        assert torch.equal(result["generated"], expected[name]["generated"]), name


@pytest.mark.parametrize("prior", ["softmax", "gla", "aft", "ssm"])
def test_the_fem_tensor_parallel_plan_names_every_sharded_weight_and_only_existing_ones(prior):
    """Every planned name is a module or parameter of the model, and every projection with a head or channel axis
    (all but the SSM's shared B / C map) and every per-channel parameter of the attention is in the plan."""
    model = model_from_preset("fem-lm-tiny", prior=prior, num_hidden_layers=1, aft_decay=prior == "aft")
    attention = model.model.layers[0].self_attn
    plan = {name.removeprefix("layers.*.self_attn."): style for name, style in model.config.base_model_tp_plan.items()
            if name.startswith("layers.*.self_attn.")}
    owned = {name for name, _ in attention.named_children()} | {name for name, _ in attention.named_parameters(
        recurse=False)}
    assert set(plan) <= owned
    replicated = {"time_decay", "bc_proj"}  # low-rank / shared by every channel: each process holds it whole
    assert owned - replicated == set(plan)
    assert plan["o_proj"] == "rowwise" and all(style == "colwise" for name, style in plan.items() if name != "o_proj")
