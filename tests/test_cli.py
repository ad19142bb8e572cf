"""The `energyzoo` command as a user meets it: one-line answers to bad input (exit code 2, a traceback only with
--debug), local paths checked before the network, `recipes`, a fast --help, `eval` flags passed through to lm-eval,
intermediate checkpoints evaluated and exported, trackers beside metrics.jsonl."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from energyzoo.cli import main
from energyzoo.training.recipe import load_recipe
from energyzoo.training.recipe_files import shipped_recipe_path
from energyzoo.training.run import run_training

ONLINE = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}  # a Hub lookup would wait on the network
TINY = ["training.steps=4", "training.save_every=2", "training.eval_every=2", "training.log_every=1",
        "training.warmup_steps=1", "training.batch_size=4", "model.overrides.hidden_size=32",
        "model.overrides.intermediate_size=64", "model.overrides.num_hidden_layers=2", "tokenizer.train_vocab_size=300"]


def energyzoo(*args) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    return subprocess.run(["energyzoo", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    output = tmp_path_factory.mktemp("run")
    run_training(load_recipe("fem-lm-tiny", [*TINY, f"output_dir={output}"]), progress=False)
    return output


def test_help_lists_the_verbs_and_the_debug_flag():
    done = energyzoo("--help")
    assert done.returncode == 0 and "recipes" in done.stdout and "--debug" in done.stdout


@pytest.mark.parametrize("args", [["--help"], ["recipes"], ["train"], ["bench", "--repeats", "many"],
                                  ["reproduce", "fem-argmx"], ["reproduce", "--help"], ["eval", "no-such-folder"],
                                  ["export", "no-such-folder", "out"], ["train", "fem-lm-tinyy"],
                                  ["eval", "x", "--suite", "nosuch"], ["train", "fem-lm-tiny", "training.stepz=3"],
                                  ["train", "fem-lm-tiny", "--stop-after", "-3"], ["train", "fem-lm-tiny", "--resum"],
                                  ["convert", "hyperset-original", "x.pt", "out", "--set", "n_recurr=3"]])
def test_help_listing_recipes_and_argument_errors_answer_without_importing_torch(args, tmp_path):
    script = tmp_path / "energyzoo"  # a console script of that name, as pip writes it
    script.write_text("import sys\nfrom energyzoo.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
                      "print('torch imported' if 'torch' in sys.modules else 'no torch')\n")
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().endswith("no torch"), done.stdout + done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "fem-lm-tiy"], "energyzoo bench: error: argument NAME: 'fem-lm-tiy' is not one; did you mean "
                              "'fem-lm-tiny'? (energyzoo bench --help lists every one)"),
    (["reproduce", "fem-argmx"], "energyzoo reproduce: error: argument experiment: 'fem-argmx' is not one; did you "
                                 "mean 'fem-argmax'? (energyzoo reproduce --help lists every one)"),
    (["eval", "x", "--suite", "nosuch"], "energyzoo eval: error: argument --suite: 'nosuch' is not one (energyzoo "
                                         "eval --help lists every one)"),
    (["bench", "--repeats", "many"], "energyzoo bench: error: argument --repeats: invalid int value: 'many' "
                                     "(energyzoo bench --help for the usage)"),
    # a prefix of a flag is a typo, not the flag (argparse's abbreviations are off)
    (["train", "fem-lm-tiny", "--resum"], "energyzoo train: error: unrecognized argument: --resum; did you mean "
                                          "'--resume'? (energyzoo train --help for the usage)"),
    (["train", "fem-lm-tiny", "--stop-after", "-3"], "energyzoo train: error: argument --stop-after: must be a whole "
                                                     "number >= 1, got '-3' (energyzoo train --help for the usage)"),
    (["train", "fem-lm-tiny", "--stop-after", "0"], "energyzoo train: error: argument --stop-after: must be a whole "
                                                    "number >= 1, got '0' (energyzoo train --help for the usage)"),
    (["quickstart", "--steps", "-1"], "energyzoo quickstart: error: argument --steps: must be a whole number >= 1, "
                                      "got '-1' (energyzoo quickstart --help for the usage)"),
])
def test_an_argument_typo_is_answered_in_one_line_with_the_closest_name(args, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines() == [message]


def test_bench_and_reproduce_help_list_every_name_by_family(capsys):
    for args in (["bench", "--help"], ["reproduce", "--help"]):
        with pytest.raises(SystemExit):
            main(args)
    shown = capsys.readouterr().out
    assert "  fem: fem-aft-tiny, fem-gla-1.3b," in shown and "  tel: tel-gpt2, tel-vit, tel-resnet" in shown
    assert "  eer: eer-induction, eer-block-screen" in shown and "  fem: fem-argmax, fem-lm, fem-mad" in shown


@pytest.mark.parametrize(("args", "message"), [
    (["train", "fem-lm-tinyy"], "no recipe file 'fem-lm-tinyy' and no shipped recipe of that name; did you mean "
                                "'fem-lm-tiny'? (every one: energyzoo recipes)"),
    (["train", "fem-lm-tiny", "model.init_from=runs/gpt2/model"],
     "recipe model.init_from must be an existing folder or a Hub id (user/name), got 'runs/gpt2/model'"),
    (["train", "fem-lm-tiny", "tokenizer.name=./my-tokenizer"], "recipe tokenizer.name must be an existing folder"),
    (["eval", "runs/no-such-run"], "runs/no-such-run is not a folder"),
    (["export", "missing_dir", "out"], "missing_dir is not a folder"),
])
@pytest.mark.slow
def test_bad_paths_are_answered_in_one_line_with_exit_code_2_before_any_network_wait(args, message, tmp_path):
    """Online, against a Hub endpoint that records connections: none is made (the old export waited 31 s on the
    Hub before answering)."""
    with socket.create_server(("127.0.0.1", 0)) as hub:
        hub.setblocking(False)
        endpoint = {"HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}"}
        done = subprocess.run(["energyzoo", *args], capture_output=True, text=True, timeout=300,
                              env={**ONLINE, **endpoint}, cwd=tmp_path)
        with pytest.raises(BlockingIOError):
            hub.accept()
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"energyzoo {args[0]}: error: ") and message in lines[0], done.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()  # nothing created on the way


@pytest.mark.parametrize(("args", "message"), [
    (["train", "fem-lm-tiny", "model.preset=fem-lm-tinyy"],
     "unknown preset 'fem-lm-tinyy'; did you mean 'fem-lm-tiny'? (every preset: energyzoo bench --help)"),
    (["train", "fem-lm-tiny", "training.steps"], "override 'training.steps' must look like key=value"),
    (["train", "fem-lm-tiny", "training.learning_rte=0.1"],
     "recipe training.learning_rte: Key 'learning_rte' not in 'TrainingSection'. Did you mean: 'learning_rate'?"),
    (["train", "fem-lm-tiny", "training.steps=many"],
     "recipe training.steps: Value 'many' of type 'str' could not be converted to Integer"),
    (["train", "fem-lm-tiny", "training.adam_betas=[0.9]"],  # was "recipe None: None"
     "recipe training.adam_betas must be [beta1, beta2], each in [0, 1), got [0.9]"),
    (["train", "fem-lm-tiny", "training.adam_betas=[0.9"], "a value is not valid YAML"),
    (["train", "fem-lm-tiny", "data.language=[english]"], "recipe data.language must be None or a list of ISO 639-1"),
    (["train", "fem-lm-tiny", "model.overrides.hidden_sise=32"],
     "recipe model: FEMConfig has no field 'hidden_sise'; did you mean 'hidden_size'?"),
    (["reproduce", "tel-stage1", "max_epochs=many"],
     "tel-stage1 settings max_epochs: Value 'many' of type 'str' could not be converted to Integer"),
    (["reproduce", "eqt-parity", "seed=[0,1]"],
     "eqt-parity settings seed: Key 'seed' not in 'Settings'. Did you mean: 'seeds'?"),
    (["reproduce", "eqt-parity", "arms=[eqt]"], "eqt-parity arms must include llama and be among "),
    (["reproduce", "eqt-parity", "eval_steps=[8,32]"], "eqt-parity eval_steps must include 0"),
    (["reproduce", "all", "seeds=3"], "reproduce all takes NAME=SETTING (an experiment's setting in this ledger"),
    (["reproduce", "all", "fem-lm=huge"], "got fem-lm=huge"),
    (["reproduce", "fem-lm", "--paper-scale"], "fem_lm has no paper-scale setting"),
    (["reproduce", "fem-lm", "--quick", "--paper-scale"], "--quick and --paper-scale are two settings"),
    (["reproduce", "ledger"], "no report in runs/reproduce/<name>/"),
    (["reproduce", "ledger", "seeds=3"], "reproduce ledger runs nothing, so it takes no settings: got seeds=3"),
    (["reproduce", "fem-lm", "--keep-other-code"], "--keep-other-code belongs to `energyzoo reproduce ledger`"),
    (["bench", "tel-gpt2", "--set", "prior=gla"], "TELGPT2Config has no field 'prior'"),
    (["bench", "--all", "fem"], "--all benches every architecture against its own baseline: drop NAME"),
    (["train", "fem-lm-tiny", "model.overrides.rms_norm_eps=-1e-5"],  # YAML reads -1e-5 as a string; the field a float
     "recipe model: FEMConfig.rms_norm_eps must be > 0, got -1e-05"),
    (["train", "fem-lm-tiny", "model.overrides.hidden_size=abc"],
     "recipe model: FEMConfig.hidden_size: Field 'hidden_size' expected int, got str (value: 'abc')"),
    (["train", "tel-vit-digits", "model.overrides.layer_norm_eps=.nan"],
     "recipe model: TELViTConfig.layer_norm_eps must be a finite number float32 holds"),
    (["train", "fem-lm-tiny", "training.mixed_precision=fp16"],  # accelerate would train in fp32 on a CPU
     "recipe training.mixed_precision must be a precision the cpu device trains in ('no', or 'bf16' on a CPU), "
     "got 'fp16'"),
    (["bench", "--device", "cuda"], "--device cuda: this torch"),
    (["bench", "--device", "gpu"], "--device 'gpu' is no torch device"),
    (["bench", "tel-vit-tiny", "--workloads", "forward", "decode"],  # a workload, but not one of the entry's
     "workloads ['decode']: tel-vit-tiny can measure forward, train_step, peak_memory"),
    (["bench", "fem-lm-tiny", "--set", "use_time_decay"], "--set 'use_time_decay': expected FIELD=VALUE"),
    (["bench", "fem-lm-tiny", "--set", "use_time_dcay=false"],
     "FEMConfig has no field 'use_time_dcay'; did you mean 'use_time_decay'?"),
])
def test_bad_values_types_precisions_and_devices_are_answered_in_one_line(args, message, tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"energyzoo {args[0]}: error: ") and message in lines[0], lines
    assert not list(tmp_path.iterdir())  # refused before anything is written


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    done = subprocess.run(["energyzoo", "--debug", "export", "missing_dir", "out"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr
    assert "UserError: missing_dir is not a folder" in done.stderr


def test_export_refuses_non_zoo_folders_in_one_line(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    assert main(["export", str(tmp_path / "gpt2"), str(tmp_path / "out")]) == 2
    assert "holds a 'gpt2' model; energyzoo exports" in capsys.readouterr().err


def test_recipes_lists_every_shipped_recipe_and_the_accelerate_configs(capsys):
    assert main(["recipes"]) == 0
    printed = capsys.readouterr().out
    recipes = shipped_recipe_path("fem-lm-tiny").parent
    for path in recipes.glob("*.yaml"):
        assert f"  {path.stem}  " in printed or f"  {path.stem} " in printed, path.stem
    assert "  fsdp " not in printed  # the accelerate configs are no recipes
    assert str(recipes) in printed and str(recipes / "accelerate" / "fsdp.yaml") in printed
    assert "FEM-LM (softmax prior) 340m on FineWeb-Edu" in printed  # a recipe's header line
    assert "Cross-entropy alone: model.preset=eer-induction-ce." in " ".join(printed.split())  # the whole header


@pytest.mark.slow
def test_eval_passes_its_settings_to_lm_eval_and_reads_checkpoints(run_folder, capsys):
    code = main(["eval", str(run_folder), "--checkpoint", "step-2", "--tasks", "energyzoo_pydoc_mc", "--dtype",
                 "bfloat16", "--num-fewshot", "1", "--limit", "5", "--batch-size", "4"])
    assert code == 0
    checkpoint_model = run_folder / "checkpoints" / "step-0000002" / "model"
    written = json.loads((checkpoint_model / "eval" / "tasks.json").read_text())
    assert written["config"]["model_dtype"] == "torch.bfloat16"  # lm-eval's own record of what it loaded
    assert written["n-shot"] == {"energyzoo_pydoc_mc": 1}
    assert written["n-samples"]["energyzoo_pydoc_mc"]["effective"] == 5
    assert written["config"]["batch_size"] == "4"
    assert json.loads((checkpoint_model / "training_metrics.json").read_text())["steps"] == 2


def test_export_takes_an_intermediate_checkpoint(run_folder, tmp_path, capsys):
    """The export holds the step-2 checkpoint's weights (the checkpoint's one copy of them, in its model/ folder:
    accelerate's own file of the weights is left out), which the final model has moved on from; the push hint names
    the checkpoint too."""
    assert main(["export", str(run_folder / "model"), str(tmp_path / "export"), "--checkpoint", "step-2"]) == 0
    assert f"{tmp_path / 'export'} --checkpoint step-2 --push <user>/<name>" in capsys.readouterr().out
    checkpoint = run_folder / "checkpoints" / "step-0000002"
    assert not list(checkpoint.glob("*.safetensors")) and not list(checkpoint.glob("pytorch_model*"))
    exported = load_file(tmp_path / "export" / "model.safetensors")
    saved = load_file(checkpoint / "model" / "model.safetensors")
    final = load_file(run_folder / "model" / "model.safetensors")
    assert exported.keys() == saved.keys()
    for name in exported:
        assert torch.equal(exported[name], saved[name]), name
    assert not torch.equal(exported["model.layers.0.mlp.up_proj.weight"], final["model.layers.0.mlp.up_proj.weight"])
    assert json.loads((tmp_path / "export" / "training_metrics.json").read_text())["steps"] == 2


def test_a_missing_checkpoint_lists_the_saved_ones(run_folder, capsys):
    assert main(["export", str(run_folder), str(run_folder / "out"), "--checkpoint", "step-3"]) == 2
    error = capsys.readouterr().err
    assert "no model in checkpoint" in error and "step-0000002" in error


def test_training_logs_to_tensorboard_beside_metrics_jsonl(run_folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = next((run_folder / "trackers").rglob("events.out.tfevents.*")).parent
    events = EventAccumulator(str(logs))
    events.Reload()
    rows = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    losses = [(row["step"], row["loss"]) for row in rows if "loss" in row]
    logged = [(event.step, event.value) for event in events.Scalars("loss")]
    assert [step for step, _ in logged] == [step for step, _ in losses]
    assert [value for _, value in logged] == pytest.approx([value for _, value in losses])
    assert [event.step for event in events.Scalars("validation_loss")] == [2, 4]


def test_report_to_names_unknown_or_missing_trackers():
    with pytest.raises(ValueError, match="report_to"):
        load_recipe("fem-lm-tiny", ["training.report_to=[tensorbord]"])
    assert load_recipe("fem-lm-tiny", ["training.report_to=none"]).training.trackers() == []


def test_doctor_without_a_gpu_refuses_and_names_the_cpu_check(capsys, monkeypatch):
    """A CI gate on `energyzoo doctor` fails on a machine without CUDA (it exited 0 with "0 passed, 0 failed, 6 not
    run"), and every way of asking says what to run on the CPU instead."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for arguments in ([], ["--device", "cuda"], ["--device", "cuda:1"], ["--device", "cpu"], ["--families"]):
        assert main(["doctor", *arguments]) == 2, arguments
        assert "energyzoo doctor --families --device cpu" in one_error_line(capsys, "doctor"), arguments


def test_doctor_families_checks_each_family_against_float64_and_refuses_a_missing_device(tmp_path, capsys,
                                                                                          monkeypatch):
    from energyzoo.bench import families

    monkeypatch.setattr(families, "CHECKED", ("eer-induction", "hyperset-digits-tiny"))
    monkeypatch.setattr(families, "DECODINGS", ("dynamic",))  # no compiling here
    output = tmp_path / "families.json"
    assert main(["doctor", "--families", "--device", "cpu", "--dtypes", "float32", "--output", str(output)]) == 0
    rows = json.loads(output.read_text())
    assert [(row["preset"], row["dtype"], row["status"]) for row in rows] == [
        ("eer-induction", "float32", "pass"), ("hyperset-digits-tiny", "float32", "pass")]
    assert rows[0]["logits_error"] < 1e-5 and set(rows[0]["decoding_errors"]) == {"dynamic"}
    said = capsys.readouterr()
    assert "2 passed, 0 failed, 0 not run" in said.out
    # each row said as it is done, before the table (the CPU check takes minutes)
    assert [line.split(" (")[0] for line in said.err.splitlines()] == [
        "eer-induction float32: pass", "hyperset-digits-tiny float32: pass"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the device check, to the dtype's
    assert main(["doctor", "--dtypes", "float16"]) == 2
    assert "float16" in one_error_line(capsys, "doctor")


def one_error_line(capsys, command: str) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"energyzoo {command}: error: "), lines
    return lines[0]


def test_a_truncated_or_unreadable_recipe_is_named_in_one_line(tmp_path, capsys, monkeypatch):
    truncated = tmp_path / "cut.yaml"
    truncated.write_text(shipped_recipe_path("fem-lm-tiny").read_text()[:300])  # an interrupted copy
    assert main(["train", str(truncated)]) == 2
    assert f"{truncated}: not valid YAML (" in one_error_line(capsys, "train")
    from omegaconf import OmegaConf

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(OmegaConf, "load", unreadable)
    assert main(["train", str(truncated)]) == 2
    assert f"{truncated}: cannot be read (Permission denied)" in one_error_line(capsys, "train")


@pytest.mark.parametrize(("text", "said"), [
    ("model:\n\tpreset: fem-lm-tiny\n", "a tab at line 2, column 1: YAML indents with spaces only"),
    ("model:\n  preset: [fem-lm-tiny\n",
     "not valid YAML (did not find expected ',' or ']' at line 3, column 1; a truncated file?)"),
    ("- fem-lm-tiny\n- 20\n", "holds no YAML mapping of sections, which a recipe is"),
])
def test_invalid_recipe_yaml_is_named_in_one_line(tmp_path, capsys, text, said):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    assert main(["train", str(recipe)]) == 2
    assert said in one_error_line(capsys, "train")


def refuse_sockets(monkeypatch) -> None:
    import socket

    def refused(*args, **kwargs):
        raise OSError(101, "Network is unreachable (sockets refused by the test)")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket, "getaddrinfo", refused)


@pytest.mark.parametrize("offline", ["0", "1"])
def test_a_push_without_network_or_credentials_says_why_and_keeps_the_folder(run_folder, tmp_path, capsys,
                                                                              monkeypatch, offline):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline == "1")  # read once, when huggingface_hub is imported
    monkeypatch.setenv("HF_TOKEN", "")
    refuse_sockets(monkeypatch)
    output = tmp_path / "export"
    assert main(["export", str(run_folder / "model"), str(output), "--push", "someone/fem-tiny"]) == 2
    line = one_error_line(capsys, "export")
    assert "--push someone/fem-tiny failed (" in line and f"{output} is complete: push it again" in line
    assert ("OfflineModeIsEnabled" if offline == "1" else "Network is unreachable") in line
    assert (output / "model.safetensors").is_file() and (output / "README.md").is_file()


def test_a_push_without_credentials_says_why_and_keeps_the_folder(run_folder, tmp_path):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import LocalTokenNotFoundError

    from energyzoo import UserError
    from energyzoo.export import export_folder

    class NoToken(HfApi):
        def create_repo(self, *args, **kwargs):  # what huggingface_hub raises where a token is required and none is
            raise LocalTokenNotFoundError("Token is required (`token=True`), but no token found.")

    output = tmp_path / "export"
    with pytest.raises(UserError, match=r"--push someone/fem-tiny failed \(LocalTokenNotFoundError: Token is required "
                                        rf".*\); {output} is complete: push it again with `hf upload someone/fem-tiny"):
        export_folder(run_folder / "model", output, push_to="someone/fem-tiny", api=NoToken())
    assert (output / "model.safetensors").is_file()


def test_an_internal_error_is_a_traceback_exit_1_and_says_it_is_a_bug(capsys, monkeypatch):
    from energyzoo.training import run

    def broken(*args, **kwargs):
        raise TypeError("create_masks_for_generate() missing 1 required positional argument")

    monkeypatch.setattr(run, "run_training", broken)
    assert main(["train", "fem-lm-tiny", *TINY, "output_dir=unused"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "TypeError: create_masks_for_generate() missing" in err
    assert err.strip().splitlines()[-1] == ("energyzoo train: internal error: this is a bug in energyzoo, not in your "
                                            "input: please report it with the traceback above")


FIRST_SCREEN_NOISE = ("Overwriting default num_fewshot", "Token indices sequence length is longer")
UNLABELLED_BAR = re.compile(r"\s*\d+%\|")  # tqdm's bar with no description before it


def test_eval_shows_labelled_bars_and_its_table_without_notices(run_folder, tmp_path):
    """On an export (whose tokenizer's model_max_length is the model's context, shorter than the perplexity task's
    documents, which lm-eval cuts into windows): no lm-eval notice that it overwrote a few-shot setting, no tokenizer
    alarm at documents longer than the context, and every progress bar labelled."""
    assert main(["export", str(run_folder / "model"), str(tmp_path / "export")]) == 0
    done = energyzoo("eval", str(tmp_path / "export"), "--output-dir", str(tmp_path / "eval"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert not [line for line in lines if any(noise in line for noise in FIRST_SCREEN_NOISE)], lines
    assert not [line for line in lines if UNLABELLED_BAR.match(line)], lines
    assert "Building contexts" in done.stderr and "|energyzoo_pydoc_ppl|" in done.stdout


def test_the_length_alarm_is_silenced_only_while_documents_are_cut_into_windows(run_folder, tmp_path):
    from transformers import AutoTokenizer
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    from energyzoo.eval.harness import windows_without_length_alarm

    assert main(["export", str(run_folder / "model"), str(tmp_path / "export")]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    long = "def f(x): return x + 1\n" * tokenizer.model_max_length
    language_model = SimpleNamespace(tokenizer=tokenizer, loglikelihood_rolling=lambda texts: [
        len(tokenizer(text)["input_ids"]) for text in texts])
    windows_without_length_alarm(language_model)
    alarms = logging.get_logger("transformers.tokenization_utils_base")
    with CaptureLogger(alarms) as windows:
        assert language_model.loglikelihood_rolling([long])[0] > tokenizer.model_max_length
    with CaptureLogger(alarms) as cut:  # an input the model would see cut: the alarm stays
        tokenizer(long)
    assert "Token indices sequence length is longer" not in windows.out
    assert "Token indices sequence length is longer" in cut.out


QUIET_QUICKSTART = """
import socket, sys, warnings
warnings.simplefilter("always")  # every warning shown, as a user's first run shows them

def refused(*args, **kwargs):
    print("NETWORK:", args[:1], file=sys.stderr)
    raise OSError(101, "Network is unreachable (sockets refused by the test)")

socket.socket.connect = refused
socket.getaddrinfo = refused
from energyzoo.cli import main
sys.exit(main(["quickstart", "--steps", "40", "--output-dir", sys.argv[1]]))
"""


@pytest.mark.slow
def test_the_quickstart_is_quiet_and_offline_without_being_told(tmp_path):
    """The quickstart's train / eval / export path with sockets refused and HF_HUB_OFFLINE unset: no network attempt,
    no warning, no git noise, one progress bar at a time (no weight-file bars), the local task's aggregations
    declared."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", QUIET_QUICKSTART, str(tmp_path / "qs")], capture_output=True,
                          text=True, timeout=900, env=environment, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    noise = [line for line in lines if any(word in line for word in (
        "NETWORK:", "Warning", "warning", "fatal:", "aggregation", "Writing model shards", "Loading weights",
        "model of type", *FIRST_SCREEN_NOISE))]
    assert not noise, noise
    assert not [line for line in lines if UNLABELLED_BAR.match(line)]
    assert "exported to" in done.stdout


def test_bench_takes_fem_fields_through_set_only(monkeypatch, capsys):
    """``--set prior=... kernel=...`` sets FEM's fields like any other; the old hidden ``--prior`` flag is gone, refused
    in one line naming it."""
    from energyzoo.bench import speed

    calls = []
    monkeypatch.setattr(speed, "run_bench", lambda name, settings, **kwargs: calls.append(settings) or {
        "title": name, "rows": [], "notes": []})
    assert main(["bench", "fem", "--set", "prior=gla", "kernel=torch", "use_lse=false", "--output", ""]) == 0
    assert calls[0].overrides == {"prior": "gla", "kernel": "torch", "use_lse": False}
    with pytest.raises(SystemExit) as refused:
        main(["bench", "fem", "--prior", "gla"])
    error = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and len(error) == 1 and "unrecognized arguments: --prior gla" in error[0], error


@pytest.mark.parametrize(("option", "message"), [
    ("n_recurr=3", "--set n_recurr is none of the authors' options; did you mean 'n_recur'?"),
    ("num_iterations=3", "--set num_iterations is energyzoo's name; the authors' option is n_recur"),
    ("foo=1", "--set foo is none of the authors' options (they are adaptive_mode, "),
])
def test_convert_refuses_an_option_name_the_authors_do_not_have(option, message, tmp_path, capsys):
    """A mistyped or energyzoo-named option would otherwise convert with the authors' default silently."""
    assert main(["convert", "hyperset-original", str(tmp_path / "x.pt"), str(tmp_path / "out"), "--set", option]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err and not (tmp_path / "out").exists()


def test_overrides_may_come_after_the_flags(tmp_path, capsys):
    """``train RECIPE --stop-after N key=value``: the overrides after a flag are the run's, not unrecognized."""
    assert main(["train", "fem-lm-tiny", "--stop-after", "1", *TINY, f"output_dir={tmp_path / 'run'}"]) == 0
    assert "stopped after step 1" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "checkpoints" / "step-0000001" / "trainer_state.json").read_text())[
        "step"] == 1


def test_push_hints_quote_paths_with_spaces(run_folder, tmp_path, capsys):
    output = tmp_path / "my export"
    assert main(["export", str(run_folder / "model"), str(output)]) == 0
    hint = capsys.readouterr().out.splitlines()[-1]
    assert f"'{output}'" in hint
    assert shlex.split(hint.removeprefix("push it with: "))[2:4] == [str(run_folder / "model"), str(output)]


def test_every_command_a_preset_note_quotes_parses():
    """A preset's note that quotes an `energyzoo` command quotes one the CLI takes (a note once named a flag that did
    not exist)."""
    from energyzoo.cli import build_parser
    from energyzoo.presets import preset_card, preset_names

    quoted = [(name, command) for name in preset_names()
              for command in re.findall(r"`(energyzoo [^`]*)`", preset_card(name).get("note", ""))]
    assert quoted
    for name, command in quoted:
        args, extras = build_parser().parse_known_args(shlex.split(command)[1:])
        assert not extras and args.command, (name, command)
