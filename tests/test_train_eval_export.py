"""`energyzoo train | eval | export` and the quickstart built on them: recipes, resume equality, two-process
equivalence, the lm-eval local suite, Hub-ready folders and their cards, the Trainer example."""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
import yaml
from contract import REMOTE_LOAD_SCRIPT, fresh_process_env
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from energyzoo.bench.speed import timed_row
from energyzoo.cli import main
from energyzoo.eval.harness import evaluate_folder, local_task_documents, write_local_tasks
from energyzoo.export import export_folder, hub_folder
from energyzoo.modeling import configuration_fem
from energyzoo.modeling.errors import UserError
from energyzoo.presets import preset_names
from energyzoo.quickstart import run_quickstart
from energyzoo.training.finetune import finetune_with_trainer
from energyzoo.training.recipe import load_recipe
from energyzoo.training.recipe_files import ACCELERATE_CONFIGS, RECIPES, shipped_recipe_path
from energyzoo.training.run import run_training
from energyzoo.training.schedule import BatchSchedule

TINY = ["training.steps=6", "training.save_every=3", "training.eval_every=3", "training.log_every=1",
        "training.warmup_steps=2", "training.batch_size=4", "model.overrides.hidden_size=32",
        "model.overrides.intermediate_size=64", "model.overrides.num_hidden_layers=2", "tokenizer.train_vocab_size=300"]


def tiny_run(output_dir, *extra, **kwargs):
    recipe = load_recipe("fem-lm-tiny", [*TINY, f"output_dir={output_dir}", *extra])
    return run_training(recipe, progress=False, **kwargs)


def metric_rows(output_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory):
    """A tiny FEM-LM trained for 30 steps, evaluated on the local suite."""
    output = tmp_path_factory.mktemp("trained")
    result = tiny_run(output, "training.steps=30", "training.save_every=30", "training.eval_every=30")
    evaluate_folder(result.model_dir)
    return result.model_dir


# recipes ---------------------------------------------------------------------------------------------
def test_shipped_recipes_validate_and_follow_the_papers():
    recipes = sorted(path.stem for path in RECIPES.glob("*.yaml"))
    assert {"fem-lm-340m", "fem-lm-1.3b", "fem-gla-340m", "fem-gla-1.3b", "fem-lm-tiny", "tel-vit-digits",
            "tel-resnet-digits"} <= set(recipes)
    for name in recipes:
        recipe = load_recipe(name)
        assert recipe.model.preset in preset_names()
    small, large = load_recipe("fem-lm-340m"), load_recipe("fem-lm-1.3b")
    for recipe, tokens in ((small, 15e9), (large, 100e9)):  # fem.txt §3
        training = recipe.training
        assert recipe.data.name == "HuggingFaceFW/fineweb-edu" and recipe.tokenizer.name == "meta-llama/Llama-2-7b-hf"
        assert recipe.data.block_size == 4096 and training.batch_size * 4096 == 524288
        assert training.steps == round(tokens / 524288) and training.warmup_steps == round(1e9 / 524288)
        assert (training.learning_rate, training.weight_decay, training.max_grad_norm) == (4e-4, 0.1, 1.0)
        assert training.mixed_precision == "bf16"
    for config in ("fsdp", "deepspeed-zero3"):
        assert yaml.safe_load((ACCELERATE_CONFIGS / f"{config}.yaml").read_text())["mixed_precision"] == "bf16"


@pytest.mark.parametrize(("override", "message"), [
    ("training.steps=0", "training.steps"),
    ("training.gradient_accumulation=3", "training.gradient_accumulation"),
    ("data.source=web", "data.source"),
    ("training.mixed_precision=fp8", "training.mixed_precision"),
    ("training.learning_rte=0.1", "Key 'learning_rte' not in 'TrainingSection'"),
    ("trainig.steps=3", "Key 'trainig' not in 'Recipe'"),
])
def test_bad_recipe_values_name_the_field(override, message):
    with pytest.raises(ValueError, match=message):
        load_recipe("fem-lm-tiny", [override])


def test_recipe_names_are_not_shadowed_by_run_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fem-lm-tiny").mkdir()  # e.g. a run folder named after the recipe
    assert load_recipe("fem-lm-tiny").model.preset == "fem-lm-tiny"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"model": {"preset": "fem-gla-tiny"}}))
    assert load_recipe("mine.yaml").model.preset == "fem-gla-tiny"
    with pytest.raises(UserError, match="no recipe file"):
        load_recipe("fem-lm-9000b")


def test_batch_schedule_walks_seeded_epochs_without_repeats():
    schedule = BatchSchedule(examples=10, batch_size=4, seed=3)
    first_epoch = torch.cat([schedule.global_batch(step) for step in range(2)]).tolist()
    first_epoch += schedule.global_batch(2)[:2].tolist()
    assert sorted(first_epoch) == list(range(10))
    assert schedule.global_batch(7).tolist() == BatchSchedule(10, 4, 3).global_batch(7).tolist()


# train -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    whole = tiny_run(tmp_path / "whole")
    stopped = tiny_run(tmp_path / "resumed", stop_after=4)
    assert stopped.model_dir is None and stopped.last_step == 4
    resumed = tiny_run(tmp_path / "resumed", resume=True)
    assert resumed.last_step == 6
    expected = load_file(whole.model_dir / "model.safetensors")
    actual = load_file(resumed.model_dir / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    def without_time(rows):
        return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]

    assert without_time(metric_rows(tmp_path / "resumed")) == without_time(metric_rows(tmp_path / "whole"))
    assert (tmp_path / "whole" / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_two_processes_with_accumulation_follow_the_single_process_run(tmp_path):
    """accelerate's prepared DataLoader, `accumulate` and `get_state_dict` save: 2 processes x 2 micro-batches of one
    example end with the losses, validation metrics and weights of one process on the whole batch of 4."""
    single = tiny_run(tmp_path / "one")
    command = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file",
               str(ACCELERATE_CONFIGS / "cpu-2proc.yaml"), "-m", "energyzoo.cli", "train", "fem-lm-tiny", *TINY,
               "training.gradient_accumulation=2", f"output_dir={tmp_path / 'two'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    two_metrics = json.loads((tmp_path / "two" / "model" / "training_metrics.json").read_text())
    assert two_metrics.pop("processes") == 2
    assert two_metrics.pop("engine") == {"name": "ddp", "stage": None, "world_size": 2}
    one_metrics = json.loads((single.model_dir / "training_metrics.json").read_text())
    assert one_metrics.pop("processes") == 1
    assert one_metrics.pop("engine") == {"name": "single", "stage": None, "world_size": 1}
    assert two_metrics.keys() == one_metrics.keys()
    for name, value in one_metrics.items():
        assert two_metrics[name] == pytest.approx(value, rel=1e-4), name
    two = [row["loss"] for row in metric_rows(tmp_path / "two") if "loss" in row]
    assert len(two) == 6
    torch.testing.assert_close(torch.tensor(two), torch.tensor(single.losses), rtol=1e-4, atol=1e-4)
    expected = load_file(single.model_dir / "model.safetensors")
    actual = load_file(tmp_path / "two" / "model" / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)


def test_gradient_accumulation_gives_the_full_batch_step(tmp_path):
    full = tiny_run(tmp_path / "full", "training.steps=3", "training.save_every=3")
    accumulated = tiny_run(tmp_path / "accumulated", "training.steps=3", "training.save_every=3",
                           "training.gradient_accumulation=2")
    torch.testing.assert_close(torch.tensor(accumulated.losses), torch.tensor(full.losses), rtol=1e-5, atol=1e-5)


def f_max_collapsed_to_mu(read):
    def collapsed(*args, **kwargs):
        result = read(*args, **kwargs)
        return result._replace(f_max=result.mu)

    return collapsed


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["fem-lm-tiny", "fem-gla-tiny"])
def test_bf16_mixed_precision_training_follows_fp32_closer_than_the_lse_branch(tmp_path, monkeypatch, preset):
    """CPU autocast bf16 through every FEM module (the conditioner's custom backward included): its losses stay
    within a quarter of the LSE branch's own effect on them, measured by the same run with f_max forced to mu
    (what an exp branch that underflowed would compute). Observed: bf16 ~2e-5 off, the branch ~5e-4."""
    settings = (f"model.preset={preset}", "training.steps=3", "training.save_every=3")
    fp32 = torch.tensor(tiny_run(tmp_path / "fp32", *settings).losses)
    bf16 = torch.tensor(tiny_run(tmp_path / "bf16", *settings, "training.mixed_precision=bf16").losses)
    for name, prior in dict(configuration_fem.PRIORS).items():
        monkeypatch.setitem(configuration_fem.PRIORS, name, replace(prior, read=f_max_collapsed_to_mu(prior.read)))
    collapsed = torch.tensor(tiny_run(tmp_path / "collapsed", *settings).losses)
    lse_effect = (collapsed - fp32).abs().mean()
    assert lse_effect > 1e-4
    assert (bf16 - fp32).abs().mean() < 0.25 * lse_effect, ((bf16 - fp32).abs().mean(), lse_effect)


def test_vision_recipe_trains_tel_resnet_on_digits(tmp_path):
    recipe = load_recipe("tel-resnet-digits", ["training.steps=60", "training.eval_every=60", "training.save_every=60",
                                               f"output_dir={tmp_path}"])
    result = run_training(recipe, progress=False)
    assert result.final_metrics["validation_accuracy"] > 0.8  # 10 classes
    saved = json.loads((result.model_dir / "config.json").read_text())
    assert saved["id2label"] == {str(digit): str(digit) for digit in range(10)}  # the classes are the digits


def test_local_jsonl_files_train_through_the_datasets_path(tmp_path):
    rows = [{"text": f"Document {i}: the quick brown fox jumps over the lazy dog. " * 20} for i in range(40)]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = tiny_run(tmp_path / "run", "data.source=hf", "data.name=json", f"data.paths=[{data}]",
                      "data.block_size=32", "training.steps=3", "training.save_every=3")
    assert result.last_step == 3 and all(math.isfinite(loss) for loss in result.losses)


# eval ------------------------------------------------------------------------------------------------
def test_local_tasks_are_well_formed():
    items, documents = local_task_documents()
    assert len(items) >= 50 and len(documents) >= 5
    for item in items:
        assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
        assert item["choices"][item["label"]].startswith(" ")
    assert len({item["label"] for item in items}) == 4  # the answer is not always in one place


def lm_eval_rows(text: str) -> list[list[str]]:
    """The cells of each row of lm-eval's markdown table in ``text`` (task, version, filter, n-shot, metric, arrow,
    value, ±, stderr); the task is named on its first row only. The table ends at its first line that is not a row
    (a card's other tables follow it)."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.replace(" ", "").startswith("|Tasks|Version|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return rows


@pytest.mark.slow
def test_eval_local_suite_writes_lm_eval_json_and_markdown(trained_model):
    results = json.loads((trained_model / "eval" / "local.json").read_text())["results"]
    assert 0 <= results["energyzoo_pydoc_mc"]["acc,none"] <= 1
    assert results["energyzoo_pydoc_ppl"]["bits_per_byte,none"] > 0
    rows = lm_eval_rows((trained_model / "eval" / "local.md").read_text())
    assert [row[0] for row in rows if row[0]] == ["energyzoo_pydoc_mc", "energyzoo_pydoc_ppl"]
    shown = {row[4]: float(row[6]) for row in rows}
    assert shown["acc"] == pytest.approx(results["energyzoo_pydoc_mc"]["acc,none"], abs=5e-4)
    assert shown["bits_per_byte"] == pytest.approx(results["energyzoo_pydoc_ppl"]["bits_per_byte,none"], abs=5e-4)


# export ----------------------------------------------------------------------------------------------
class RecordingHfApi:
    """Stands in for `huggingface_hub.HfApi`: records what would be created and uploaded."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, folder_path, repo_id, **kwargs):
        files = {str(p.relative_to(folder_path)): p.read_bytes() for p in Path(folder_path).rglob("*") if p.is_file()}
        self.calls.append(("upload_folder", repo_id, files))


def test_export_folder_card_and_push(trained_model, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(trained_model, model_dir)
    # a result on a Hub dataset, as lm-eval writes it (arc_easy reads allenai/ai2_arc, config ARC-Easy)
    local = json.loads((model_dir / "eval" / "local.json").read_text())
    general = {**local, "results": {"arc_easy": {"acc,none": 0.31, "acc_stderr,none": 0.02}}, "n-shot": {"arc_easy": 0},
               "configs": {"arc_easy": {"dataset_path": "allenai/ai2_arc", "dataset_name": "ARC-Easy",
                                        "test_split": "test"}}}
    (model_dir / "eval" / "general.json").write_text(json.dumps(general))
    (model_dir / "eval" / "general.md").write_text("| arc_easy | acc | 0.3100 | 0.0200 |\n")
    api = RecordingHfApi()
    folder = export_folder(model_dir, tmp_path / "export", push_to="someone/fem-tiny", api=api)
    # (c) the card's metadata parses back: model-index entries on Hub datasets, by their Hub ids
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert card.data.datasets == ["allenai/ai2_arc"] and card.data.language == ["en"]
    _, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert [(r.dataset_type, r.dataset_config, r.dataset_name, r.metric_type, r.metric_value) for r in results] == [
        ("allenai/ai2_arc", "ARC-Easy", "arc_easy", "acc", 0.31)]
    # the local tasks (no Hub dataset) stay in the text, with lm-eval's settings
    mc = local["results"]["energyzoo_pydoc_mc"]["acc,none"]
    (row,) = [row for row in lm_eval_rows(card.text) if row[0] == "energyzoo_pydoc_mc"]
    assert row[4] == "acc" and float(row[6]) == pytest.approx(mc, abs=5e-4)
    assert "lm-evaluation-harness 0.4.13" in card.text and "energyzoo_pydoc_mc 0-shot" in card.text
    assert "dtype torch.float32, batch size 8, device cpu" in card.text
    assert "`transformers>=5.23,<5.25`, the releases this code was tested on" in card.text
    assert "This model's preset (fem-lm-tiny) was not timed: `energyzoo bench fem`" in card.text
    assert "Free Energy Mixer" in card.text and "from_pretrained(\"someone/fem-tiny\"" in card.text
    assert ("the Python documentation shipped with CPython (`pydoc_data.topics`) in blocks of 128 tokens: 30 steps"
            in card.text)
    # (d) the upload contains the card and the code files
    assert [call[0] for call in api.calls] == ["create_repo", "upload_folder"]
    uploaded = api.calls[1][2]
    assert {"README.md", "config.json", "model.safetensors", "modeling_fem.py", "configuration_fem.py",
            "tokenizer.json", "generation_config.json"} <= set(uploaded)
    assert b"model-index" in uploaded["README.md"]
    auto_map = json.loads(uploaded["config.json"])["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}


def test_an_export_holds_nothing_of_the_machine_it_was_made_on(trained_model, tmp_path, monkeypatch):
    """No absolute path, home folder, host name, environment value or lm-eval environment dump in any text file of
    an export; the scores and versions stay. A recipe cannot read the environment, and its languages are codes."""
    planted = "hf_planted0123456789secret"
    monkeypatch.setenv("ENERGYZOO_PLANTED_SECRET", planted)
    shared = tmp_path / "shared-recipe.yaml"  # a recipe someone shares, reading the token of whoever runs it
    shared.write_text(shipped_recipe_path("fem-lm-tiny").read_text().replace(
        "language: [en]", 'language: ["${oc.env:ENERGYZOO_PLANTED_SECRET}"]'))
    with pytest.raises(UserError, match=r"recipe data.language\[0\]: '\$\{oc.env:ENERGYZOO_PLANTED_SECRET\}' calls a "
                                        "resolver"):
        load_recipe(shared)
    assert load_recipe("fem-lm-tiny", ["output_dir=runs/${data.source}"]).output_dir == "runs/python-docs"
    with pytest.raises(UserError, match=r"recipe data.language must be None or a list of ISO 639-1 codes"):
        load_recipe("fem-lm-tiny", ["data.language=[english]"])
    source = json.loads((trained_model / "eval" / "local.json").read_text())
    assert str(trained_model) in json.dumps(source) and "pretty_env_info" in source  # what lm-eval writes locally
    folder = export_folder(trained_model, tmp_path / "export")
    private = [str(trained_model.parent), str(tmp_path), str(Path.home()), planted, "Vulnerab", "pretty_env_info"]
    host = re.compile(rf"\b{re.escape(socket.gethostname())}\b")  # a word: a short host name is also a substring
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix != ".safetensors":
            text = path.read_text()
            found = [value for value in private if value in text] + host.findall(text)
            assert not found, (path.relative_to(folder), found)
    public = json.loads((folder / "eval" / "local.json").read_text())
    assert public["results"] == source["results"] and public["versions"] == source["versions"]
    assert public["lm_eval_version"] == source["lm_eval_version"] and public["config"]["model_dtype"] == "torch.float32"
    assert yaml.safe_load((folder / "recipe.yaml").read_text())["output_dir"] == trained_model.parent.name


def test_the_card_carries_the_measured_bench_rows_of_its_preset_only(trained_model, tmp_path, monkeypatch):
    rows = [asdict(timed_row(arm, "forward", [2.0, 2.0, 2.0], [1.0, 1.0, 1.0], 1.10))
            for arm in ("fem-lm-tiny", "fem-lm-tiny-wide")]
    measured = [{"title": "fem-lm-tiny vs llama-tiny (batch 1, seq 16)", "rows": rows, "notes": []}]
    monkeypatch.setattr(hub_folder, "measured_speed", lambda: measured)
    card = ModelCard.load(export_folder(trained_model, tmp_path / "export") / "README.md")
    assert "fem-lm-tiny vs llama-tiny (batch 1, seq 16)" in card.text
    assert "| fem-lm-tiny | forward (s) | 2 | 1 | 2.000 | 2.000-2.000 | <= 1.10 | missed |" in card.text
    assert "fem-lm-tiny-wide" not in card.text


@pytest.mark.slow
def test_exported_folder_loads_and_generates_without_energyzoo(trained_model, tmp_path):
    """(a) a fresh process where energyzoo cannot be imported loads the folder as remote code."""
    folder = export_folder(trained_model, tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(4, model.config.vocab_size, (1, 10))
    payload = {"auto_class": "AutoModelForCausalLM", "inputs": {"input_ids": ids},
               "generation": dict(max_new_tokens=5, do_sample=False, pad_token_id=model.config.pad_token_id)}
    with torch.no_grad():
        payload["expected"] = model(input_ids=ids).logits
    payload["generated"] = model.generate(input_ids=ids, **payload["generation"])
    torch.save(payload, tmp_path / "payload.pt")
    done = subprocess.run([sys.executable, str(REMOTE_LOAD_SCRIPT), str(folder), str(tmp_path / "payload.pt")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=fresh_process_env(tmp_path))
    assert done.returncode == 0 and "REMOTE_OK transformers_modules" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_lm_eval_cli_runs_the_exported_folder_on_the_local_task(trained_model, tmp_path):
    """(b) the stock `lm_eval` CLI, in a fresh process, with remote code."""
    folder = export_folder(trained_model, tmp_path / "export")
    tasks = write_local_tasks(tmp_path / "tasks")
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={folder},trust_remote_code=True", "--include_path", str(tasks), "--tasks",
               "energyzoo_pydoc_mc", "--device", "cpu", "--batch_size", "8", "--limit", "20",
               "--output_path", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result_files = list((tmp_path / "out").rglob("results_*.json"))
    assert result_files
    accuracy = json.loads(result_files[0].read_text())["results"]["energyzoo_pydoc_mc"]["acc,none"]
    assert 0 <= accuracy <= 1


def test_tel_classifier_exports_with_its_card_and_accuracy(tmp_path):
    recipe = load_recipe("tel-resnet-digits", ["training.steps=20", "training.warmup_steps=2", "training.eval_every=20",
                                               "training.save_every=20",
                                               f"output_dir={tmp_path / 'run'}"])
    trained = run_training(recipe, progress=False)
    code = main(["export", str(trained.model_dir), str(tmp_path / "export")])
    assert code == 0
    card = ModelCard.load(tmp_path / "export" / "README.md")
    assert card.data.pipeline_tag == "image-classification" and "Thermodynamic Equilibrium Layers" in card.text
    assert "Trained with `energyzoo train` on scikit-learn's 8x8 digits: 20 steps" in card.text
    assert "model-index" not in card.data.to_dict()  # the digits are no Hub dataset
    assert f"Held-out validation at the end: accuracy {trained.final_metrics['validation_accuracy']:.4f}" in card.text
    auto_map = json.loads((tmp_path / "export" / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForImageClassification"}
    # the folder's image processor reproduces the training preprocessing: the pipeline predicts what the model does
    from PIL import Image
    from transformers import pipeline

    from energyzoo.data.digits import digits_split

    _, _, images, _ = digits_split(0.2, 42)
    with torch.no_grad():
        expected = load_trained(trained.model_dir)(pixel_values=images[:40]).logits.argmax(-1)
    pictures = [Image.fromarray(((image[0] + 1) * 8 * 255 / 16).round().numpy().astype("uint8"), mode="L")
                for image in images[:40]]
    classifier = pipeline("image-classification", model=str(tmp_path / "export"), trust_remote_code=True)
    predicted = [int(result[0]["label"].removeprefix("LABEL_")) for result in classifier(pictures, top_k=1)]
    assert predicted == expected.tolist() and len(set(expected.tolist())) > 1  # not one constant answer


def test_a_warm_started_run_keeps_the_checkpoint_weights_and_names_its_base_model(tmp_path):
    """TEL-GPT2 from a vanilla GPT-2 folder (TEL's warm start): the GPT-2 weights carry over, the TEL layer is
    initialised, the folder's tokenizer is used; the card's base_model names a Hub id (a local folder is none)."""
    from transformers import GPT2LMHeadModel

    from energyzoo import model_from_preset
    from energyzoo.data.text import python_docs_corpus, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(python_docs_corpus()[0][:50], 300)
    vanilla = model_from_preset("gpt2-tiny", vocab_size=len(tokenizer), n_layer=2)
    assert isinstance(vanilla, GPT2LMHeadModel)
    vanilla.save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    recipe = load_recipe("tel-gpt2-tiny", ["training.steps=1", "training.warmup_steps=0",
                                           "training.learning_rate=1.0e-9", "training.batch_size=2",
                                           "model.overrides.n_layer=2",
                                           f"model.init_from={tmp_path / 'gpt2'}", f"output_dir={tmp_path / 'run'}"])
    trained = run_training(recipe, progress=False)
    weights, start = load_file(trained.model_dir / "model.safetensors"), vanilla.state_dict()
    for name in ("transformer.wte.weight", "transformer.h.1.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.weight"):
        torch.testing.assert_close(weights[name], start[name], rtol=0, atol=1e-6)  # one step of lr 1e-9 from them
    assert any(".tel_" in name for name in weights)
    assert (trained.model_dir / "tokenizer.json").read_text() == (tmp_path / "gpt2" / "tokenizer.json").read_text()
    card = ModelCard.load(export_folder(trained.model_dir, tmp_path / "local") / "README.md")
    assert "base_model" not in card.data.to_dict()
    saved = yaml.safe_load((trained.model_dir / "recipe.yaml").read_text())
    saved["model"]["init_from"] = "openai-community/gpt2"
    (trained.model_dir / "recipe.yaml").write_text(yaml.safe_dump(saved))
    card = ModelCard.load(export_folder(trained.model_dir, tmp_path / "hub") / "README.md")
    assert card.data.base_model == "openai-community/gpt2"


def load_trained(model_dir):
    from transformers import AutoModelForImageClassification

    return AutoModelForImageClassification.from_pretrained(model_dir).eval()


UNTESTED_TRANSFORMERS = """
import sys, transformers
transformers.__version__ = sys.argv[2]
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
"""
NO_REMOTE_CODE = """
import json, sys
sys.modules["energyzoo"] = None  # a plain transformers environment
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
transformers.logging.set_verbosity_warning()
tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])
print("IDS:", json.dumps(tokenizer("def f(x): return x").input_ids))
print("TRUNCATED:", len(tokenizer("x = 1\\n" * 2000, truncation=True).input_ids))
try:
    AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=False)
except ValueError as error:
    print("MODEL:", str(error).splitlines()[0])
"""


def run_in_terminal(command: list[str], timeout: float = 120) -> str:
    """What ``command`` writes to a pseudo-terminal it runs under (where transformers asks about remote code and
    waits for an answer); answers nothing."""
    import pty
    import select

    pid, terminal = pty.fork()
    if pid == 0:
        os.execvp(command[0], command)
    written = b""
    while select.select([terminal], [], [], timeout)[0]:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        written += chunk
    os.kill(pid, 9) if not os.waitpid(pid, os.WNOHANG)[0] else None
    return written.decode(errors="replace").replace("\r\n", "\n")



@pytest.mark.slow
def test_exported_code_refuses_untested_transformers_and_the_tokenizer_needs_no_remote_code(trained_model, tmp_path):
    """The folder's code loads only on the releases it was tested on, the package's own range (below and above it
    a release is refused in one line, instead of decoding wrong tokens); its tokenizer needs no remote code."""
    from transformers import AutoTokenizer

    folder = export_folder(trained_model, tmp_path / "export")
    for release in ("5.22.0", "5.25.0"):
        untested = subprocess.run([sys.executable, "-c", UNTESTED_TRANSFORMERS, str(folder), release],
                                  capture_output=True, text=True, timeout=300)
        assert untested.returncode == 1
        assert (f"UntestedTransformers: energyzoo's model code was tested on transformers >=5.23,<5.25, but {release} "
                "is installed: install one of those") in untested.stderr
    allowed = subprocess.run([sys.executable, "-c", UNTESTED_TRANSFORMERS, str(folder), "5.25.0"], capture_output=True,
                             text=True, timeout=300, env={**os.environ, "ENERGYZOO_ALLOW_UNTESTED_TRANSFORMERS": "1"})
    assert allowed.returncode == 0, allowed.stderr[-2000:]  # what the upstream canary runs under
    written = run_in_terminal([sys.executable, "-c", NO_REMOTE_CODE, str(folder)])
    assert "[y/N]" not in written and "model of type" not in written, written  # no prompt, no config read
    lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in written.splitlines()
             if line.startswith(("IDS: ", "TRUNCATED: ", "MODEL: "))}
    assert json.loads(lines["IDS"]) == AutoTokenizer.from_pretrained(trained_model)("def f(x): return x").input_ids
    assert int(lines["TRUNCATED"]) == AutoConfig.from_pretrained(trained_model).max_position_embeddings
    assert lines["MODEL"].startswith("The repository") and "custom code" in lines["MODEL"]  # transformers' advice
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not {"is_local", "local_files_only", "name_or_path"} & set(settings)


def test_fem_sequence_classifier_exports_as_text_classification_where_the_pipeline_runs(tmp_path):
    """The card declares the text-classification pipeline only for a folder with a tokenizer, and that pipeline then
    runs on it and answers what the model computes."""
    from transformers import pipeline

    from energyzoo import FEMConfig, FEMForSequenceClassification
    from energyzoo.data.text import python_docs_corpus, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(python_docs_corpus()[0][:50], 300)
    config = FEMConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_labels=3, pad_token_id=0)
    classifier = FEMForSequenceClassification(config).eval()
    classifier.save_pretrained(tmp_path / "classifier")
    assert main(["export", str(tmp_path / "classifier"), str(tmp_path / "bare")]) == 0
    assert ModelCard.load(tmp_path / "bare" / "README.md").data.pipeline_tag is None  # no tokenizer: no pipeline
    tokenizer.save_pretrained(tmp_path / "classifier")
    assert main(["export", str(tmp_path / "classifier"), str(tmp_path / "export")]) == 0
    card = ModelCard.load(tmp_path / "export" / "README.md")
    assert card.data.pipeline_tag == "text-classification" and "AutoModelForSequenceClassification" in card.text
    config_json = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config_json["architectures"] == ["FEMForSequenceClassification"]
    text = "def f(x): return x"
    with torch.no_grad():
        expected = classifier(**tokenizer(text, return_tensors="pt")).logits.argmax(-1).item()
    predicted = pipeline(card.data.pipeline_tag, model=str(tmp_path / "export"), trust_remote_code=True)(text)
    assert predicted[0]["label"] == f"LABEL_{expected}"


# Trainer example and quickstart ----------------------------------------------------------------------
def test_trainer_example_fine_tunes_a_trained_folder(trained_model, tmp_path):
    trainer = finetune_with_trainer(trained_model, tmp_path / "tuned", max_steps=12, batch_size=4, block_size=64)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0]
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "tuned")).__name__ == "FEMForCausalLM"


@pytest.mark.slow
def test_short_quickstart_trains_evaluates_and_exports(tmp_path):
    report = run_quickstart(tmp_path / "qs", steps=40, batch_size=8, progress=False)
    assert report.validation_loss < report.uniform_loss - 1.0
    assert report.sample.startswith("The assert statement")
    assert 0 <= report.local_results["energyzoo_pydoc_mc"]["acc"] <= 1
    card = ModelCard.load(report.export_dir / "README.md")
    assert card.data.language == ["en"]
    rows = lm_eval_rows(card.text)  # the local results (no Hub dataset): in the text
    assert [row[0] for row in rows if row[0]] == ["energyzoo_pydoc_mc", "energyzoo_pydoc_ppl"]
    model = AutoModelForCausalLM.from_pretrained(report.export_dir, trust_remote_code=True)
    assert model.config.model_type == "fem"
    assert report.energy_plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert card.data.model_name == "qs"  # the quickstart's folder, not its run subfolder "train"
    # batched generate continues each row's last token: the exported tokenizer pads on the left
    tokenizer = AutoTokenizer.from_pretrained(report.export_dir)
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["The assert statement", "A"], return_tensors="pt", padding=True)
    together = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    alone = model.generate(**tokenizer(["A"], return_tensors="pt"), max_new_tokens=4, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(together[1, -4:], alone[0, -4:])
    # a second quickstart into the folder replaces it only when told, and the earlier export stays until then
    earlier = (report.export_dir / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="holds an earlier quickstart"):
        run_quickstart(tmp_path / "qs", steps=40, batch_size=8, progress=False)
    assert (report.export_dir / "model.safetensors").read_bytes() == earlier
