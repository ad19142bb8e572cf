"""A run is never lost nor mixed with another: checkpoints are written whole (a kill at any moment resumes to the
weights of an uninterrupted run), hold the weights once and rotate, and a run folder belongs to one run."""

import json
import logging
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from energyzoo.training.recipe import load_recipe
from energyzoo.training.run import run_training

# a tiny FEM-LM run that checkpoints after every step, on one thread (so that processes compute the same floats)
RUN = ["training.steps=8", "training.save_every=1", "training.eval_every=4", "training.log_every=1",
       "training.num_threads=1", "training.warmup_steps=2", "training.batch_size=4", "model.overrides.hidden_size=32",
       "model.overrides.intermediate_size=64", "model.overrides.num_hidden_layers=2", "tokenizer.train_vocab_size=300"]


def train(output_dir, *extra, **kwargs):
    recipe = load_recipe("fem-lm-tiny", [*RUN, f"output_dir={output_dir}", *extra])
    return run_training(recipe, progress=False, **kwargs)


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(Path(run_dir) / "model" / "model.safetensors")


def assert_same_weights(actual, expected) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def metric_rows(run_dir) -> list[dict]:
    return [{key: value for key, value in json.loads(line).items() if key != "seconds"}
            for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    output = tmp_path_factory.mktemp("uninterrupted")
    train(output)
    return output


def newer(folder: Path, pattern: str, since: float) -> bool:
    for path in folder.glob(pattern):
        try:
            if path.stat().st_mtime >= since:
                return True
        except FileNotFoundError:  # published (renamed) or removed between the listing and the look: poll again
            continue
    return False


@pytest.mark.slow
def test_runs_killed_at_random_moments_resume_to_the_weights_of_an_uninterrupted_run(uninterrupted, tmp_path):
    """`energyzoo train` SIGKILLed, then resumed with --resume, again and again: during a checkpoint's save (a few
    milliseconds after its partial folder appears), at a random moment of training, during start-up and during the
    final save of the model folder. The run ends with the uninterrupted run's weights and metrics, bit for bit."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "energyzoo.cli", "train", "fem-lm-tiny", *RUN, f"output_dir={run}"]
    generator = random.Random(0)
    kills = ["save", "moment", "save", "startup", "final"]
    outputs = []
    for attempt, kill in enumerate([*kills, None]):
        process = subprocess.Popen(command + ["--resume"] * (attempt > 0), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        started, deadline = time.time(), None
        while kill is not None and process.poll() is None:
            if deadline is None:
                trigger = {"save": newer(run / "checkpoints", ".step-*.partial", started),
                           "moment": newer(run / "checkpoints", "step-*", started),
                           "startup": True, "final": newer(run, ".model.partial", started)}[kill]
                if trigger:
                    delay = {"save": 0.02, "moment": 0.3, "startup": 6.0, "final": 0.01}[kill]
                    deadline = time.time() + generator.uniform(0, delay)
            elif time.time() >= deadline:
                process.kill()
            time.sleep(0.001)
        output, _ = process.communicate(timeout=300)
        outputs.append(output)
        if kill is None:
            assert process.returncode == 0, output[-3000:]
    assert any("a save that was interrupted (removed)" in output for output in outputs), "no kill hit a save"
    assert not list((run / "checkpoints").glob(".*")) and not list(run.glob(".*"))
    assert_same_weights(weights(run), weights(uninterrupted))
    assert metric_rows(run) == metric_rows(uninterrupted)


@pytest.mark.slow
def test_resume_takes_the_newest_complete_checkpoint_and_says_which_it_skipped(uninterrupted, tmp_path, caplog):
    """A run stopped after step 5, then the debris of a kill: step 6's save interrupted (its partial folder), a
    checkpoint folder without its trainer state (as the old direct writes left them) and a metrics row cut short.
    --resume skips both folders, saying why, and continues from step 5 to the uninterrupted weights."""
    run = tmp_path / "run"
    train(run, stop_after=5)
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step-0000005", checkpoints / ".step-0000006.partial")
    shutil.copytree(checkpoints / "step-0000005", checkpoints / "step-0000007")
    (checkpoints / "step-0000007" / "trainer_state.json").unlink()
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 6, "loss": 3.')
    with caplog.at_level(logging.WARNING, logger="energyzoo.training.checkpoints"):
        train(run, resume=True)
    notes = caplog.text
    assert ".step-0000006.partial, a save that was interrupted (removed)" in notes
    assert "step-0000007: incomplete (no trainer_state.json)" in notes
    assert_same_weights(weights(run), weights(uninterrupted))
    assert metric_rows(run) == metric_rows(uninterrupted)


def test_checkpoints_hold_the_weights_once_and_keep_the_newest(uninterrupted):
    checkpoints = sorted(path.name for path in (uninterrupted / "checkpoints").iterdir())
    assert checkpoints == ["step-0000005", "step-0000006", "step-0000007"]  # save_total_limit 3 of 7 saves
    for name in checkpoints:
        folder = uninterrupted / "checkpoints" / name
        assert not list(folder.glob("*.safetensors")) and not list(folder.glob("*.bin.index.json"))
        assert (folder / "model" / "model.safetensors").is_file() and (folder / "optimizer.bin").is_file()


def test_every_checkpoint_is_kept_with_no_limit(tmp_path):
    train(tmp_path, "training.steps=4", "training.save_total_limit=null")
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        "step-0000001", "step-0000002", "step-0000003"]


def test_a_folder_holding_a_run_is_refused_unless_resumed_or_overwritten(uninterrupted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    (run / "notes.txt").write_text("mine")
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"holds a run already \(recipe.yaml, metrics.jsonl, .*\): pass --resume "
                                         r"to continue it or --overwrite to start it over"):
        train(run)
    assert (run / "metrics.jsonl").read_text() == before  # nothing of the old run was touched
    with pytest.raises(ValueError, match="pass one of them"):
        train(run, resume=True, overwrite=True)
    train(run, "training.steps=2", overwrite=True)
    assert [row["step"] for row in metric_rows(run) if "loss" in row] == [1, 2]
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["step-0000001"]
    assert (run / "notes.txt").read_text() == "mine"  # only the old run's files were removed
    assert yaml.safe_load((run / "recipe.yaml").read_text())["training"]["steps"] == 2
    assert sorted(path.name for path in run.iterdir() if path.name.startswith(".")) == []  # no lock, nothing set aside


def test_an_interrupted_overwrite_keeps_the_old_run_until_a_new_one_ends_well(uninterrupted, tmp_path):
    """Ctrl-C during an --overwrite: the old run's files wait in .replaced-run (its model whole), the new run resumes,
    and once it ends the old files go."""
    from energyzoo.training.run import RunStopped

    run = shutil.copytree(uninterrupted, tmp_path / "run")

    def ctrl_c_at_the_first_evaluation(model, step):
        if step:
            raise KeyboardInterrupt
        return {}

    with pytest.raises(RunStopped, match="stopped at step 4 \\(Ctrl-C\\); --resume continues from step 3"):
        train(run, overwrite=True, evaluation_hook=ctrl_c_at_the_first_evaluation)
    assert_same_weights(load_file(run / ".replaced-run" / "model" / "model.safetensors"), weights(uninterrupted))
    assert not (run / "model").exists() and not list(run.rglob("*.partial"))
    train(run, resume=True)
    assert not (run / ".replaced-run").exists() and (run / "model" / "model.safetensors").is_file()


def test_resume_of_a_folder_that_holds_no_run_is_refused(uninterrupted, tmp_path):
    """A mistyped output_dir under --resume would otherwise start a new run from step 0."""
    with pytest.raises(ValueError, match=r"--resume: .*holds no run to continue \(no recipe.yaml\)"):
        train(tmp_path / "rnu", resume=True)
    assert not (tmp_path / "rnu").exists()
    finished = shutil.copytree(uninterrupted, tmp_path / "finished")
    with pytest.raises(ValueError, match="finished \\(step 8; its model is .*nothing to continue"):
        train(finished, resume=True)


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_holds_nothing(tmp_path):
    """One process writes a run folder: another (--overwrite and --resume included) is refused in one line naming the
    holder; the lock of a process killed with SIGKILL is gone with it."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom energyzoo.files import FolderLock\n"
                               "FolderLock(sys.argv[1]).__enter__()\nprint('held', flush=True)\ntime.sleep(600)",
                               str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for flags in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(ValueError, match=rf"{run} is being written by process {holder.pid} on .*: wait for it"):
                train(run, **flags)
    finally:
        holder.kill()
        holder.wait()
    assert (run / ".energyzoo.lock").is_file()  # what a killed process leaves: a file, no lock
    train(run, "training.steps=2")
    assert not (run / ".energyzoo.lock").exists()


def test_the_quickstart_refuses_an_earlier_quickstart_and_foreign_folders(tmp_path, capsys):
    from energyzoo.cli import main

    earlier = tmp_path / "quickstart"
    (earlier / "export").mkdir(parents=True)
    (earlier / "energies.png").write_bytes(b"png")
    assert main(["quickstart", "--output-dir", str(earlier)]) == 2
    assert "holds an earlier quickstart" in capsys.readouterr().err and (earlier / "energies.png").is_file()
    (earlier / "thesis.tex").write_text("mine")
    assert main(["quickstart", "--output-dir", str(earlier), "--overwrite"]) == 2
    assert "not a quickstart's" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "named"), [
    ("training.learning_rate=1.0e-3", "training.learning_rate (0.003 -> 0.001)"),
    ("training.batch_size=8", "training.batch_size (4 -> 8)"),
    ("training.steps=12", "training.steps (8 -> 12)"),
    ("data.block_size=64", "data.block_size (128 -> 64)"),
    ("model.overrides.num_hidden_layers=3", "model.overrides ("),
])
def test_resuming_with_settings_that_change_the_run_is_refused_by_name(uninterrupted, tmp_path, change, named):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    with pytest.raises(ValueError, match=r"--resume: this recipe changes .*would mix two runs") as refused:
        train(run, change, resume=True)
    assert named in str(refused.value)


@pytest.mark.slow
def test_resuming_with_a_new_logging_and_saving_schedule_continues_the_run(uninterrupted, tmp_path):
    run = tmp_path / "run"
    train(run, stop_after=3)
    train(run, "training.log_every=2", "training.save_total_limit=1", "training.num_threads=2", resume=True)
    assert_same_weights(weights(run), weights(uninterrupted))
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["step-0000007"]


def test_resume_without_a_checkpoint_starts_the_run_at_step_zero(uninterrupted, tmp_path, caplog):
    """--resume on a run killed before its first checkpoint (its recipe and tokenizer written) starts it over."""
    run = tmp_path / "run"
    train(run, "training.save_every=100", stop_after=1)
    shutil.rmtree(run / "checkpoints")  # what a kill before the first save leaves
    with caplog.at_level(logging.WARNING, logger="energyzoo.training.run"):
        train(run, "training.save_every=100", resume=True)
    assert "no complete checkpoint" in caplog.text and "starting at step 0" in caplog.text
    assert_same_weights(weights(run), weights(uninterrupted))


def test_a_warmup_longer_than_the_run_is_clamped_with_a_note(caplog):
    with caplog.at_level(logging.WARNING, logger="energyzoo.training.recipe"):
        recipe = load_recipe("fem-lm-tiny", ["training.steps=20"])  # the recipe's warmup is 30 steps
    assert recipe.training.warmup_steps == 19
    assert "training.warmup_steps 30 >= steps 20: warming up over the whole run (19 steps)" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["validation_loss", "validation_next_token_accuracy"])
def test_keep_best_keeps_the_model_of_the_best_evaluation_even_across_a_resume(tmp_path, metric):
    """best-model/ holds the weights the checkpoint of the best evaluation holds (lowest loss, highest accuracy; the
    steps read from metrics.jsonl), also when the run is interrupted and resumed in between."""
    options = ("training.eval_every=1", "training.save_total_limit=null", f"training.keep_best={metric}",
               "training.learning_rate=0.02")
    train(tmp_path, *options, stop_after=4)
    result = train(tmp_path, *options, resume=True)
    evaluations = [row for row in metric_rows(tmp_path) if metric in row]
    assert [row["step"] for row in evaluations] == list(range(1, 9))
    values = [row[metric] for row in evaluations]
    assert len(set(values)) > 1  # the choice is a real one
    best = (min if metric.endswith("loss") else max)(range(8), key=values.__getitem__)
    best_step = evaluations[best]["step"]
    expected = (tmp_path / "model" if best_step == 8 else tmp_path / "checkpoints" / f"step-{best_step:07d}" / "model")
    assert result.best_model_dir == tmp_path / "best-model"
    assert_same_weights(load_file(result.best_model_dir / "model.safetensors"),
                        load_file(expected / "model.safetensors"))
    assert json.loads((result.best_model_dir / "training_metrics.json").read_text())["steps"] == best_step


def test_keep_best_names_the_metrics_an_evaluation_has(tmp_path):
    with pytest.raises(ValueError, match="keep_best: the evaluation has no metric 'validation_bleu'; it has .*"
                                         "validation_loss"):
        train(tmp_path, "training.steps=2", "training.eval_every=1", "training.keep_best=validation_bleu")
    with pytest.raises(ValueError, match="keep_best"):
        train(tmp_path, "training.keep_best=loss", overwrite=True)


def test_stop_after_saves_its_last_step_so_resume_continues_from_it(uninterrupted, tmp_path, caplog):
    """docs/training.md's example: a recipe that saves every 100 steps, stopped after 3 (was: nothing saved, and
    --resume started at step 0). save_every beyond the run is warned about."""
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="energyzoo.training.recipe"):
        stopped = train(run, "training.save_every=100", stop_after=3)
    assert "training.save_every 100 > steps 8: no checkpoint before the final model" in caplog.text
    assert stopped.model_dir is None and sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "step-0000003"]
    train(run, "training.save_every=100", resume=True)
    assert [row["step"] for row in metric_rows(run) if "loss" in row] == list(range(1, 9))
    assert_same_weights(weights(run), weights(uninterrupted))


@pytest.fixture(scope="module")
def stopped_at_five(tmp_path_factory):
    run = tmp_path_factory.mktemp("stopped") / "run"
    train(run, stop_after=5)
    return run


# every kind of file a checkpoint holds (the model folder's code files are copies of the package's, like config.json)
CHECKPOINT_FILES = ["model/model.safetensors", "model/config.json", "model/generation_config.json",
                    "model/tokenizer.json", "model/tokenizer_config.json", "model/recipe.yaml",
                    "model/training_metrics.json", "model/modeling_fem.py", "optimizer.bin", "scheduler.bin",
                    "random_states_0.pkl", "trainer_state.json", "manifest.json"]


@pytest.mark.parametrize("damaged", CHECKPOINT_FILES)
def test_resume_skips_a_checkpoint_with_a_truncated_file_for_the_intact_one_before_it(stopped_at_five, uninterrupted,
                                                                                      tmp_path, caplog, damaged):
    """An interrupted copy of the run folder: one file of the newest checkpoint cut in half. --resume names it, goes
    back to the checkpoint before and ends with the uninterrupted run's weights."""
    run = tmp_path / "run"
    shutil.copytree(stopped_at_five, run)
    path = run / "checkpoints" / "step-0000005" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="energyzoo.training.checkpoints"):
        train(run, resume=True)
    skipped = [line for line in caplog.text.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and "step-0000005: " in skipped[0] and damaged.split("/")[-1] in skipped[0], skipped
    assert "resuming from the checkpoint before it" in skipped[0]
    assert_same_weights(weights(run), weights(uninterrupted))
    assert metric_rows(run) == metric_rows(uninterrupted)


def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` (root in a container may; None where the machine refuses)."""
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return path if mounted.returncode == 0 else None


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_one_line_and_the_run_resumes_after_space_is_freed(stopped_at_five,
                                                                                         uninterrupted, tmp_path,
                                                                                         monkeypatch):
    """The newest checkpoint fills the disk: the error says so and where the run can resume from (not torch's
    'unexpected pos'), nothing partial is left, and once there is space --resume ends with the uninterrupted run's
    weights. On a small tmpfs where the machine allows mounting one, else with the write raising ENOSPC."""
    from energyzoo.modeling.errors import UserError
    from energyzoo.training import run as run_module

    def pages(folder: Path) -> int:  # what a tmpfs holds a folder in: whole 4 KiB pages per file
        return sum(-(-path.stat().st_size // 4096) * 4096 for path in folder.rglob("*") if path.is_file())

    room = pages(stopped_at_five) + pages(stopped_at_five / "checkpoints" / "step-0000005") // 2
    disk = small_disk(tmp_path / "disk", str(room))  # the run and half a checkpoint
    run = (disk or tmp_path) / "run"
    if disk is None:
        original = run_module._Run.save_checkpoint

        def fills_the_disk(self, folder, step, metrics):
            original(self, folder, step, metrics)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(run_module._Run, "save_checkpoint", fills_the_disk)
    try:
        shutil.copytree(stopped_at_five, run)
        with pytest.raises(UserError, match=rf"cannot write .*no space left on the device; the run in {run} can resume "
                                            r"from step 5 \(make room"):
            train(run, resume=True)
        assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
            "step-0000003", "step-0000004", "step-0000005"]  # no partial folder left
        if disk is not None:
            subprocess.run(["mount", "-o", "remount,size=50m", str(disk)], check=True)
        monkeypatch.undo()
        train(run, resume=True)
        assert_same_weights(weights(run), weights(uninterrupted))
    finally:
        if disk is not None:
            subprocess.run(["umount", str(disk)], check=False)
