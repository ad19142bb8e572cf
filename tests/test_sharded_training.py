"""Training beyond one process: FSDP2 sharding of every architecture (gloo on CPU) against unsharded data
parallelism in float64, evaluation that gives every process the same number of forward passes, and the
activation-checkpointing knob."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from energyzoo import model_from_preset
from energyzoo.training.recipe import load_recipe
from energyzoo.training.run import evaluate, run_training
from energyzoo.training.tasks import TrainingData, training_task

sys.path.insert(0, str(Path(__file__).parent))
from sharded_training import PRESETS, tiny_model, train_unsharded  # noqa: E402

SCRIPT = Path(__file__).with_name("sharded_training.py")


def test_fsdp2_sharded_training_of_every_architecture_matches_unsharded_data_parallelism(tmp_path):
    output = tmp_path / "sharded.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(SCRIPT), str(output)], capture_output=True, text=True, timeout=600,
                          env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    assert done.returncode == 0, done.stderr[-4000:]
    sharded = torch.load(output)
    for preset in PRESETS:
        reference, initial = train_unsharded(preset), tiny_model(preset)
        assert sharded[preset]["sharded_blocks"], preset  # the blocks themselves were sharded, not only the root
        torch.testing.assert_close(sharded[preset]["losses"], reference["losses"], rtol=1e-6, atol=0, msg=preset)
        assert sharded[preset]["weights"].keys() == reference["weights"].keys(), preset
        for name, expected in reference["weights"].items():
            torch.testing.assert_close(sharded[preset]["weights"][name], expected, rtol=1e-9, atol=1e-12,
                                       msg=f"{preset} {name}")
        moved = max(float((reference["weights"][name] - parameter.detach()).abs().max())
                    for name, parameter in initial.named_parameters())
        assert moved > 1e-3, preset  # the compared weights did train


class OneProcessOfMany:
    """What `evaluate` reads of an Accelerator, as process ``index`` of ``processes``; `reduce` keeps this
    process's totals (the test adds them up)."""

    def __init__(self, index: int, processes: int):
        self.process_index, self.num_processes, self.device = index, processes, torch.device("cpu")
        self.totals = None

    def reduce(self, tensor, reduction):
        self.totals = tensor
        return tensor


def test_evaluation_runs_as_many_forward_passes_on_every_process_and_adds_up_to_one_process():
    model = model_from_preset("eer-induction").eval()
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    ids = torch.randint(0, 7, (5, 9), generator=torch.Generator().manual_seed(0))
    data = TrainingData(None, None, ids, ids)
    task = training_task("causal-lm")
    alone = OneProcessOfMany(0, 1)
    evaluate(model, data, task, alone, batch_size=2)
    counts, totals = [], []
    for index in range(2):  # 3 and 2 examples: two batches each, the second process's last one a dropped pad
        process = OneProcessOfMany(index, 2)
        calls.clear()
        evaluate(model, data, task, process, batch_size=2)
        counts.append(len(calls))
        totals.append(process.totals)
    assert counts == [2, 2]
    torch.testing.assert_close(totals[0] + totals[1], alone.totals)
    assert alone.totals[:, 1].tolist() == [5, 5 * 8]  # (loss, next-token accuracy): each example, each label once


TINY = ["training.steps=3", "training.save_every=3", "training.eval_every=3", "training.log_every=1",
        "training.warmup_steps=1", "training.batch_size=4", "model.overrides.hidden_size=32",
        "model.overrides.intermediate_size=64", "model.overrides.num_hidden_layers=2", "tokenizer.train_vocab_size=300"]


def test_activation_checkpointing_recomputes_every_block_and_keeps_the_losses(tmp_path, monkeypatch):
    import energyzoo.training.run as run

    block_calls = []
    build = run.build_model

    def counting_build(recipe, tokenizer):
        model = build(recipe, tokenizer)
        # transformers checkpoints a block's `forward`: its sub-modules start again in backward (a pre-hook: torch's
        # recomputation stops as soon as it has the saved tensors back, before the block's last module returns)
        for layer in model.model.layers:
            layer.mlp.register_forward_pre_hook(lambda module, args: block_calls.append(1))
        return model

    monkeypatch.setattr(run, "build_model", counting_build)
    losses, counts = {}, {}
    for knob in (False, True):
        block_calls.clear()
        recipe = load_recipe("fem-lm-tiny", [*TINY, f"output_dir={tmp_path / str(knob)}",
                                             f"training.activation_checkpointing={str(knob).lower()}"])
        losses[knob] = run_training(recipe, progress=False).losses
        counts[knob] = len(block_calls)
    assert counts[True] - counts[False] == 3 * 2  # every training forward of both blocks ran again in backward
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=1e-6, atol=1e-6)


def test_activation_checkpointing_is_refused_for_a_model_without_checkpointed_blocks(tmp_path):
    recipe = load_recipe("tel-resnet-digits", ["training.steps=2", "training.warmup_steps=0",
                                               "training.activation_checkpointing=true", f"output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="activation_checkpointing.*TELResNetForImageClassification"):
        run_training(recipe, progress=False)
