"""`energyzoo train` under the launcher's sharded engines, on CPU (gloo), 2 processes: DeepSpeed ZeRO-2 and ZeRO-3 with
the shipped `recipes/accelerate/deepspeed-zero3.yaml` (``--zero_stage 2`` for ZeRO-2) and FSDP2 with the shipped
`recipes/accelerate/fsdp.yaml`, each against one process of the same recipe from the same saved weights (accelerate
builds a ZeRO-3 model under DeepSpeed's sharded initialisation, which draws other initial weights); kill and resume; the
model folders they save; what is refused. transformers' `Trainer` with ``deepspeed=`` against its own data parallelism.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from sharded_training import largest_difference
from transformers import AutoModelForCausalLM

from energyzoo.export import export_folder
from energyzoo.modeling.errors import UserError
from energyzoo.training.engines import Engine, check_resumable, hand_recipe_to_deepspeed
from energyzoo.training.recipe import load_recipe
from energyzoo.training.recipe_files import ACCELERATE_CONFIGS
from energyzoo.training.run import run_training

pytestmark = pytest.mark.slow  # processes of their own

pytest.importorskip("deepspeed", reason="the [deepspeed] extra")

DEEPSPEED = {"zero2": ["--zero_stage", "2"], "zero3": []}
# AdamW (the recipe's), clipping that acts (the gradient norms of these steps are 0.3-2), 2 micro-batches per step
RECIPE = ["training.steps=4", "training.save_every=2", "training.eval_every=2", "training.log_every=1",
          "training.warmup_steps=1", "training.batch_size=4", "training.gradient_accumulation=2",
          "training.max_grad_norm=0.25", "model.overrides.hidden_size=32", "model.overrides.intermediate_size=64",
          "model.overrides.num_hidden_layers=2"]


def launch(config: str, output_dir: Path, *options: str, launcher: tuple = (), check: bool = True):
    command = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file",
               str(ACCELERATE_CONFIGS / f"{config}.yaml"), "--num_processes", "2", *launcher,
               "-m", "energyzoo.cli", "train", "fem-lm-tiny", *RECIPE, f"output_dir={output_dir}", *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def losses(output_dir: Path) -> list[float]:
    rows = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [row["loss"] for row in map(json.loads, rows) if "loss" in row]


def assert_same(actual: dict, expected: dict, tolerance: float, what: str) -> None:
    assert actual.keys() == expected.keys(), what
    # the "Scaling out" table of docs/training.md (pytest -rP)
    print(f"{what}: weights {largest_difference(actual, expected):.1e}")
    for name, value in expected.items():
        if tolerance == 0:
            assert torch.equal(actual[name], value), f"{what} {name}"
        else:
            torch.testing.assert_close(actual[name], value, rtol=0, atol=tolerance, msg=f"{what} {name}")


def killed_after_step_2(whole: Path, folder: Path) -> Path:
    """The run folder of ``whole`` as a kill after its step-2 checkpoint leaves it: the checkpoint, and the metric rows
    of steps 3 and 4, which ``--resume`` drops and recomputes."""
    shutil.copytree(whole, folder, ignore=lambda parent, names: ["model", "loss_curve.png"] if Path(parent) == whole
                    else [])
    assert (folder / "checkpoints" / "step-0000002").is_dir() and len(losses(folder)) == 4
    return folder


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """(the saved starting weights, the one-process run from them)."""
    root = tmp_path_factory.mktemp("one")
    start = run_training(load_recipe("fem-lm-tiny", [*RECIPE, "training.steps=1", "training.save_every=1",
                                                     f"output_dir={root / 'start'}"]), progress=False).model_dir
    recipe = load_recipe("fem-lm-tiny", [*RECIPE, f"model.init_from={start}", f"output_dir={root / 'run'}"])
    return start, run_training(recipe, progress=False)


@pytest.mark.parametrize("stage", sorted(DEEPSPEED))
def test_deepspeed_training_matches_one_process_and_resumes_exactly(one_process, tmp_path, stage):
    start, single = one_process
    whole = tmp_path / "whole"
    done = launch("deepspeed-zero3", whole, f"model.init_from={start}", launcher=DEEPSPEED[stage])
    engine = {"name": "deepspeed", "stage": int(stage[-1]), "world_size": 2}
    assert f"DeepSpeed ZeRO-{engine['stage']} on 2 processes" in done.stdout
    assert json.loads((whole / "model" / "training_metrics.json").read_text())["engine"] == engine
    checkpoint = whole / "checkpoints" / "step-0000002"
    assert json.loads((checkpoint / "trainer_state.json").read_text()) == {"step": 2, "engine": engine}
    assert (checkpoint / "pytorch_model").is_dir() and not (checkpoint / "optimizer.bin").exists()  # ZeRO's shards
    torch.testing.assert_close(losses(whole), single.losses, rtol=0, atol=1e-6)
    assert_same(weights(whole / "model"), weights(single.model_dir), 1e-6, f"{stage} vs one process")
    moved = max(float((weights(start)[name] - value).abs().max()) for name, value in weights(single.model_dir).items())
    assert moved > 1e-3  # the compared weights did train
    loaded = AutoModelForCausalLM.from_pretrained(whole / "model", trust_remote_code=True)  # no DeepSpeed state
    assert loaded.dtype == torch.float32
    export_folder(whole / "model", tmp_path / "export")
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"Trained with `energyzoo train` (DeepSpeed ZeRO-{engine['stage']} on 2 processes)" in card

    resumed = killed_after_step_2(whole, tmp_path / "resumed")
    with pytest.raises(UserError, match=f"written by DeepSpeed ZeRO-{engine['stage']} on 2 processes; this run is "
                                        "one process"):
        run_training(load_recipe("fem-lm-tiny", [*RECIPE, f"model.init_from={start}", f"output_dir={resumed}"]),
                     resume=True, progress=False)
    launch("deepspeed-zero3", resumed, f"model.init_from={start}", "--resume", launcher=DEEPSPEED[stage])
    assert_same(weights(resumed / "model"), weights(whole / "model"), 0, f"{stage} resumed")
    assert losses(resumed) == losses(whole)


def test_fsdp2_training_matches_one_process_and_resumes_exactly(one_process, tmp_path):
    start, single = one_process
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    done = launch("fsdp", whole, f"model.init_from={start}")
    assert "FSDP2 on 2 processes" in done.stdout
    assert json.loads((whole / "checkpoints" / "step-0000002" / "trainer_state.json").read_text())["engine"] == {
        "name": "fsdp", "stage": 2, "world_size": 2}
    torch.testing.assert_close(losses(whole), single.losses, rtol=0, atol=1e-6)
    assert_same(weights(whole / "model"), weights(single.model_dir), 1e-6, "FSDP2 vs one process")
    launch("fsdp", killed_after_step_2(whole, resumed), f"model.init_from={start}", "--resume")
    assert_same(weights(resumed / "model"), weights(whole / "model"), 0, "FSDP2 resumed")
    assert losses(resumed) == losses(whole)


def test_deepspeed_saves_its_float32_master_weights_of_a_bf16_run(tmp_path):
    done = launch("deepspeed-zero3", tmp_path, "training.steps=2", "training.mixed_precision=bf16",
                  launcher=DEEPSPEED["zero2"])
    saved = weights(tmp_path / "model")
    assert {value.dtype for value in saved.values()} == {torch.float32}, done.stdout[-2000:]
    assert json.loads((tmp_path / "model" / "config.json").read_text())["dtype"] == "float32"
    # the masters, not the bf16 copies the forward pass ran on: most trained values lie between bf16 numbers
    matrix = saved["model.layers.0.mlp.down_proj.weight"]
    assert (matrix != matrix.bfloat16().float()).float().mean() > 0.9


def test_a_precision_the_engine_cannot_run_on_the_device_is_refused_in_one_line(tmp_path):
    done = launch("fsdp", tmp_path, "training.mixed_precision=fp16", check=False)  # no fp16 autocast on CPU
    errors = [line for line in done.stderr.splitlines() if line.startswith("energyzoo train: error:")]
    assert done.returncode != 0 and errors and all("training.mixed_precision" in line for line in errors)
    assert "energyzoo/" not in done.stderr  # no traceback of ours (the launcher reports its failed processes)


def deepspeed_run(config: dict):
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config)))


def test_the_recipe_decides_clipping_accumulation_and_micro_batch_under_deepspeed():
    config = {"gradient_clipping": "auto", "zero_optimization": {"stage": 3}}  # accumulation and micro-batch absent
    hand_recipe_to_deepspeed(deepspeed_run(config), max_grad_norm=3.0, accumulation=2, micro=4)
    assert config == {"gradient_clipping": 3.0, "gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": 4,
                      "zero_optimization": {"stage": 3}}
    hand_recipe_to_deepspeed(deepspeed_run(dict(config)), max_grad_norm=3.0, accumulation=2, micro=4)  # agreeing
    with pytest.raises(UserError, match=r"gradient_clipping 1.0 \(the recipe's 3.0\)"):
        hand_recipe_to_deepspeed(deepspeed_run({"gradient_clipping": 1.0}), max_grad_norm=3.0, accumulation=1, micro=1)
    with pytest.raises(UserError, match=r"gradient_accumulation_steps 4 \(the recipe's 1\)"):
        hand_recipe_to_deepspeed(deepspeed_run({"gradient_accumulation_steps": 4}), 1.0, accumulation=1, micro=1)


def test_resume_refuses_another_engine_stage_or_world_size_and_takes_unrecorded_checkpoints():
    zero3 = Engine("deepspeed", 3, 2)
    check_resumable(zero3.to_dict(), zero3, "step-2")
    check_resumable(None, zero3, "step-2")  # written before engines were recorded
    for other in (Engine("deepspeed", 2, 2), Engine("deepspeed", 3, 4), Engine("fsdp", 2, 2), Engine("ddp", None, 2)):
        with pytest.raises(UserError, match=f"written by DeepSpeed ZeRO-3 on 2 processes; this run is "
                                            f"{other.describe()}"):
            check_resumable(zero3.to_dict(), other, "step-2")


TRAINER_SCRIPT = Path(__file__).parent / "support" / "trainer_engines.py"


def test_trainer_with_deepspeed_matches_its_data_parallel_training(tmp_path):
    def train(engine: str) -> dict[str, torch.Tensor]:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(TRAINER_SCRIPT), str(tmp_path / engine), engine], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-4000:]
        return weights(tmp_path / engine)

    reference = train("ddp")
    for engine in ("zero2", "zero3"):
        trained = train(engine)
        # the tied output head is saved under its own name by DeepSpeed's gather too
        assert_same({name: trained[name] for name in reference}, reference, 1e-6, f"Trainer {engine}")
